//! A [`CompositeGraph`] as cuDNN backend descriptors: one tensor descriptor per tensor, one
//! MATMUL / POINTWISE / REDUCTION / RESHAPE operation per node (fp32 math for matmuls and
//! reductions, each pointwise node's own precision), then the shared operation graph →
//! heuristics → plan path of `backend.rs`. Not yet run on a GPU: any failure is a
//! `backend::Fail`, which the caller turns into a fall-back to sinter's flash kernels.

use std::collections::HashMap;

use cs::cudnnBackendAttributeName_t as A;
use cs::cudnnBackendAttributeType_t as T;
use cs::cudnnBackendDescriptorType_t as K;
use cudarc::cudnn::sys as cs;

use super::backend::{data_type, finish, tensor_desc, Desc, Fail, Plan};
use super::composite::{Binding, CompositeGraph, Node, OpKind, Pw, Red};
use super::graph::Elem;

type R<X> = std::result::Result<X, Fail>;

/// The graph's plan: every tensor, every node, in order.
pub(super) fn build(handle: cs::cudnnHandle_t, c: &CompositeGraph) -> R<Plan> {
    let mut tensors = HashMap::new();
    for t in &c.tensors {
        let by_value = matches!(t.binding, Binding::ByValue(_));
        let d = tensor_desc(t.uid, t.elem, &t.dims, &t.strides, t.is_virtual(), by_value)?;
        tensors.insert(t.uid, d);
    }
    let mut ops = Vec::with_capacity(c.nodes.len());
    let mut keep = Vec::new();
    for n in &c.nodes {
        let (op, inner) = operation(n, &tensors)?;
        ops.push(op);
        keep.extend(inner);
    }
    keep.extend(tensors.into_values());
    finish(handle, ops, keep)
}

pub(super) fn pointwise_mode(m: Pw) -> cs::cudnnPointwiseMode_t {
    use cs::cudnnPointwiseMode_t as M;
    match m {
        Pw::Mul => M::CUDNN_POINTWISE_MUL,
        Pw::Add => M::CUDNN_POINTWISE_ADD,
        Pw::Sub => M::CUDNN_POINTWISE_SUB,
        Pw::Div => M::CUDNN_POINTWISE_DIV,
        Pw::Exp => M::CUDNN_POINTWISE_EXP,
        Pw::Log => M::CUDNN_POINTWISE_LOG,
        Pw::GenIndex(_) => M::CUDNN_POINTWISE_GEN_INDEX,
        Pw::CmpGe => M::CUDNN_POINTWISE_CMP_GE,
        Pw::BinarySelect => M::CUDNN_POINTWISE_BINARY_SELECT,
        Pw::Identity => M::CUDNN_POINTWISE_IDENTITY,
    }
}

/// The operation descriptor of node `n` and the inner descriptor it refers to.
fn operation(n: &Node, t: &HashMap<i64, Desc>) -> R<(Desc, Vec<Desc>)> {
    let get = |uid: i64| {
        t.get(&uid).ok_or(Fail {
            step: "composite attention: a node names an unknown tensor",
            status: cs::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM as u32,
        })
    };
    let input = |i: usize| get(n.inputs[i]);
    let out = get(n.output)?;
    let float = [data_type(Elem::Float)];
    match n.kind {
        OpKind::Matmul => {
            let m = Desc::new(K::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
            m.set(
                A::CUDNN_ATTR_MATMUL_COMP_TYPE,
                T::CUDNN_TYPE_DATA_TYPE,
                &float,
            )?;
            let m = m.finalize()?;
            let op = Desc::new(K::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[input(0)?])?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[input(1)?])?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[out])?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&m])?;
            Ok((op.finalize()?, vec![m]))
        }
        OpKind::Pointwise { mode, compute } => {
            let pw = Desc::new(K::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
            pw.set(
                A::CUDNN_ATTR_POINTWISE_MODE,
                T::CUDNN_TYPE_POINTWISE_MODE,
                &[pointwise_mode(mode)],
            )?;
            pw.set(
                A::CUDNN_ATTR_POINTWISE_MATH_PREC,
                T::CUDNN_TYPE_DATA_TYPE,
                &[data_type(compute)],
            )?;
            if let Pw::GenIndex(axis) = mode {
                pw.set(
                    A::CUDNN_ATTR_POINTWISE_AXIS,
                    T::CUDNN_TYPE_INT64,
                    &[axis as i64],
                )?;
            }
            let pw = pw.finalize()?;
            let op = Desc::new(K::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[input(0)?])?;
            if n.inputs.len() > 1 {
                op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[input(1)?])?;
            }
            if n.inputs.len() > 2 {
                op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[input(2)?])?;
            }
            op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[out])?;
            Ok((op.finalize()?, vec![pw]))
        }
        OpKind::Reduction(r) => {
            let red = Desc::new(K::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
            let operator = match r {
                Red::Max => cs::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX,
                Red::Add => cs::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD,
            };
            red.set(
                A::CUDNN_ATTR_REDUCTION_OPERATOR,
                T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                &[operator],
            )?;
            red.set(
                A::CUDNN_ATTR_REDUCTION_COMP_TYPE,
                T::CUDNN_TYPE_DATA_TYPE,
                &float,
            )?;
            let red = red.finalize()?;
            let op = Desc::new(K::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[input(0)?])?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[out])?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&red])?;
            Ok((op.finalize()?, vec![red]))
        }
        OpKind::Reshape => {
            let op = Desc::new(K::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[input(0)?])?;
            op.set_descs(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[out])?;
            Ok((op.finalize()?, Vec::new()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cudnn::sdpa::graph::{SdpaLayout, SdpaPass, SdpaProblem};
    use crate::dtype::DType;

    /// Every node of both passes has the operand count its operation kind takes, and each
    /// pointwise mode maps to a distinct cuDNN mode.
    #[test]
    fn every_node_lowers_to_its_operation_shape() {
        let p = SdpaProblem {
            b: 1,
            h: 2,
            tq: 128,
            tk: 256,
            d: 64,
            dtype: DType::F16,
            causal: true,
            scale: 0.5,
        };
        for pass in [SdpaPass::Forward, SdpaPass::Backward] {
            let c = CompositeGraph::build(&p, &SdpaLayout::dense(&p), pass).unwrap();
            for n in &c.nodes {
                let want = match n.kind {
                    OpKind::Matmul => 2..=2,
                    OpKind::Reduction(_) | OpKind::Reshape => 1..=1,
                    OpKind::Pointwise {
                        mode: Pw::BinarySelect,
                        ..
                    } => 3..=3,
                    OpKind::Pointwise {
                        mode: Pw::Exp | Pw::Log | Pw::Identity | Pw::GenIndex(_),
                        ..
                    } => 1..=1,
                    OpKind::Pointwise { .. } => 2..=2,
                };
                assert!(want.contains(&n.inputs.len()), "{pass:?} {}", n.name);
            }
        }
        let modes = [
            Pw::Mul,
            Pw::Add,
            Pw::Sub,
            Pw::Div,
            Pw::Exp,
            Pw::Log,
            Pw::GenIndex(2),
            Pw::CmpGe,
            Pw::BinarySelect,
            Pw::Identity,
        ];
        let mapped: std::collections::HashSet<u32> =
            modes.iter().map(|m| pointwise_mode(*m) as u32).collect();
        assert_eq!(mapped.len(), modes.len());
        assert_eq!(
            data_type(Elem::Boolean),
            cs::cudnnDataType_t::CUDNN_DATA_BOOLEAN
        );
    }
}
