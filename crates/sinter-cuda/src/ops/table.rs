//! The kernel table: one declarative row per kernel family (kernel source, name rule, argument
//! slots, launch geometry, traffic rule) and the one planner that turns a row plus a call's
//! operands into a [`Launch`]. The op wrappers check their arguments and make one call into
//! it; the NVRTC compile-all test plans one sample of every kernel a row names, so a kernel
//! cannot be compiled without a wrapper or launched without being compiled.
//!
//! A row's source is a built-in kernel file of this crate, or a `.cu` file that lives beside
//! its op in sinter-core's kernel folders ([`Source::User`]): those rows are planned the same
//! way ([`Kernel::plan_user`]) and launched with their source
//! ([`CudaDevice::launch_user`](crate::CudaDevice::launch_user)).

use super::common::{coalesce_operands, fake_slice, numel, StridedIn};
use crate::alloc::DevSlice;
use crate::check::need_len;
use crate::dtype::DType;
use crate::emulated::cost::OpClass;
use crate::error::{CudaError, Result};
use crate::launch::{
    row_block, rows_grid, Arg, ArgBytes, Launch, LaunchTarget, StridedMeta, Traffic, ELEMWISE_BLOCK,
};
use crate::nvrtc::KernelFile;
use crate::user_kernel::{UserFile, UserLaunch};

/// Where a row's kernels are compiled from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// A built-in kernel file (its kind of work for the cost model follows from the file).
    File(KernelFile),
    /// A kernel file of an op outside this crate, with the kind of work its declared traffic is
    /// (what [`Launch::class`] tells for a built-in file).
    User(&'static UserFile, OpClass),
}

/// One kernel family: the kernels one name rule spells over its ops and dtypes.
pub struct Kernel {
    pub source: Source,
    /// The kernel name: `{op}` is the call's op, `{d}` its dtype's suffix, `{d2}` the second
    /// dtype's suffix, `{w}` the unsigned word of `{d}`'s size (`u8` .. `u64`).
    pub name: &'static str,
    /// The values `{op}` takes (one empty name when the rule has no `{op}`).
    pub ops: fn() -> Vec<&'static str>,
    /// The dtypes `{d}` (and `{w}`) take: the kernels instantiated in the kernel file.
    pub dtypes: &'static [DType],
    /// The dtypes `{d2}` takes (empty when the rule has no `{d2}`).
    pub dtypes2: &'static [DType],
    /// The kernel's parameters, in order.
    pub args: &'static [Slot],
    pub grid: Grid,
    pub traffic: Cost,
}

/// One kernel parameter: a device operand (taken in order from [`Call::operands`]), the
/// call's work items, or a scalar (taken in order from [`Call::scalars`], checked by type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// An operand the kernel reads (its bytes count as read).
    In(&'static str),
    /// An operand the kernel writes (its bytes count as written).
    Out(&'static str),
    /// An operand the kernel updates in place (its bytes count as read and as written).
    InOut(&'static str),
    /// The work items, as i64.
    Items,
    I64(&'static str),
    U64(&'static str),
    I32(&'static str),
    F32(&'static str),
    /// A pointer the kernel may skip (0 = none: an optional output), not counted as traffic.
    Ptr(&'static str),
    /// The strided-operand description of a broadcasting kernel.
    Strided,
    /// A C struct of this many bytes, by value ([`Arg::bytes`]).
    Struct(&'static str, usize),
}

/// The launch geometry of a row: grid and block from the call's work items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// 256-thread blocks, each thread moving one 128-bit pack of `{d}` per iteration.
    Packed,
    /// 256-thread blocks, one item per thread (grid-stride beyond the cap).
    PerItem,
    /// 256-thread blocks, one group of this many items per thread (the random kernels draw
    /// four numbers per Philox call).
    Groups(usize),
    /// One block of this many threads.
    OneBlock(u32),
    /// A row-group per block for rows of [`Call::row`] elements ([`row_block`]), one row per
    /// item.
    Rows,
    /// One block of this many threads per item (grid-stride beyond the cap).
    BlockPerItem(u32),
    /// One block per item sized for a row of [`Call::row`] elements: `per_thread` elements
    /// a thread (None: one 128-bit pack of `{d}`), a power of two from 32 to `max_threads`
    /// threads (grid-stride beyond the cap).
    BlockPerRow {
        per_thread: Option<usize>,
        max_threads: u32,
    },
    /// Tiles of this block shape over the grid the call gives ([`Call::tiles`]).
    Tiled((u32, u32, u32)),
}

/// What the cost model is told a launch moves and computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// Nothing declared: the cost model estimates it ([`Launch::estimate`]).
    Estimated,
    /// Reads every `In` operand whole, writes every `Out` operand, and does `flops` operations
    /// per work item.
    Moves { flops: usize },
    /// Reads and writes each work item once, as elements of `{d}` (a strided copy, whose
    /// operands may be wider than the items they move).
    Items,
    /// Like `Moves`, but the `In` operands are read in part (broadcast, gathered): the call
    /// gives the bytes read ([`Call::read`]).
    Partial { flops: usize },
    /// Reads every `In` operand whole and writes every `Out` operand, with one operation per
    /// element of the first `In` (a reduction).
    Reduce,
    /// Reads every `In` operand whole and writes every `Out` operand, with `flops` operations
    /// per element read (a multi-tensor reduction, whose work items are its blocks).
    Scan { flops: usize },
}

/// One call of a row: everything its slots, name rule and geometry take.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub op: &'static str,
    pub dtype: DType,
    /// `{d2}`'s dtype (ignored by rules without it).
    pub dtype2: DType,
    /// The work items: the `Items` slot and the grid.
    pub items: usize,
    pub operands: &'a [DevSlice<'a>],
    pub scalars: &'a [Arg],
    /// Bytes the `In` operands read, for [`Cost::Partial`].
    pub read: Option<usize>,
    /// The row length, for [`Grid::Rows`] and [`Grid::BlockPerRow`].
    pub row: usize,
    /// The grid, for [`Grid::Tiled`].
    pub tiles: (u32, u32, u32),
}

impl<'a> Call<'a> {
    /// A call of `items` work items over `operands` of dtype `dtype`, without scalars.
    pub fn new(dtype: DType, items: usize, operands: &'a [DevSlice<'a>]) -> Self {
        Call {
            op: "",
            dtype,
            dtype2: dtype,
            items,
            operands,
            scalars: &[],
            read: None,
            row: 0,
            tiles: (1, 1, 1),
        }
    }

    pub fn row(self, row: usize) -> Self {
        Call { row, ..self }
    }

    pub fn tiles(self, tiles: (u32, u32, u32)) -> Self {
        Call { tiles, ..self }
    }

    pub fn op(self, op: &'static str) -> Self {
        Call { op, ..self }
    }

    pub fn scalars(self, scalars: &'a [Arg]) -> Self {
        Call { scalars, ..self }
    }

    pub fn dtype2(self, dtype2: DType) -> Self {
        Call { dtype2, ..self }
    }
}

/// The unsigned word of a dtype's size: what size-only kernels (copies) are named by.
pub fn word_name(d: DType) -> &'static str {
    match d.size() {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        _ => "u64",
    }
}

/// The `ops` of a row without `{op}`.
pub fn no_ops() -> Vec<&'static str> {
    vec![""]
}

impl Kernel {
    /// The kernel name of `call` under this row's rule.
    pub fn kernel_name(&self, call: &Call<'_>) -> String {
        self.name
            .replace("{op}", call.op)
            .replace("{d2}", call.dtype2.suffix())
            .replace("{d}", call.dtype.suffix())
            .replace("{w}", word_name(call.dtype))
    }

    /// The launch of `call`, None when it has no work items. An error when the call does not
    /// fit the row (a dtype without a kernel, operands or scalars not matching the slots).
    pub fn plan(&self, t: &LaunchTarget, call: &Call<'_>) -> Result<Option<Launch>> {
        if call.items == 0 {
            return Ok(None);
        }
        let (args, read, written, first_in) = self.args_of(call)?;
        let (grid, block) = self.geometry(t, call);
        let file = match self.source {
            Source::File(f) => Some(f),
            Source::User(..) => None,
        };
        let launch = Launch {
            grid,
            block,
            ..Launch::new(file, self.kernel_name(call), 1, 1, args)
        };
        let traffic = match self.traffic {
            Cost::Estimated => return Ok(Some(launch)),
            Cost::Moves { flops } => Traffic::bytes(read, written).with_flops(flops * call.items),
            Cost::Items => {
                let bytes = call.items * call.dtype.size();
                Traffic::bytes(bytes, bytes)
            }
            Cost::Partial { flops } => {
                let read = call
                    .read
                    .ok_or_else(|| self.mismatch("no bytes read given"))?;
                Traffic::bytes(read, written).with_flops(flops * call.items)
            }
            Cost::Reduce => Traffic::bytes(read, written).with_flops(first_in.0),
            Cost::Scan { flops } => Traffic::bytes(read, written).with_flops(flops * first_in.1),
        };
        Ok(Some(launch.with_traffic(traffic)))
    }

    /// The launch of `call` of a row whose source lives beside its op, as
    /// [`CudaDevice::launch_user`](crate::CudaDevice::launch_user) takes it (with the row's kind
    /// of work); None without work items.
    pub fn plan_user(&self, t: &LaunchTarget, call: &Call<'_>) -> Result<Option<UserLaunch>> {
        let Source::User(_, class) = self.source else {
            return Err(self.mismatch("a built-in kernel file's row planned as a user kernel"));
        };
        Ok(self.plan(t, call)?.map(|l| to_user(l, class)))
    }

    /// Grid and block of `call` under the row's geometry rule.
    fn geometry(&self, t: &LaunchTarget, call: &Call<'_>) -> ((u32, u32, u32), (u32, u32, u32)) {
        let line = |grid: u32, block: u32| ((grid, 1, 1), (block, 1, 1));
        match self.grid {
            Grid::Packed => line(
                t.elementwise_grid(call.items, call.dtype.size()),
                ELEMWISE_BLOCK,
            ),
            Grid::PerItem => line(t.grid_for(call.items, ELEMWISE_BLOCK), ELEMWISE_BLOCK),
            Grid::Groups(k) => line(
                t.grid_for(call.items.div_ceil(k), ELEMWISE_BLOCK),
                ELEMWISE_BLOCK,
            ),
            Grid::OneBlock(threads) => line(1, threads),
            Grid::Rows => {
                let (bx, by) = row_block(call.row);
                ((rows_grid(t, call.items, by, bx * by), 1, 1), (bx, by, 1))
            }
            Grid::BlockPerItem(threads) => line(blocks_for(t, call.items, threads), threads),
            Grid::BlockPerRow {
                per_thread,
                max_threads,
            } => {
                let per_thread = per_thread.unwrap_or(16 / call.dtype.size());
                let threads = call
                    .row
                    .div_ceil(per_thread)
                    .next_power_of_two()
                    .clamp(32, max_threads as usize) as u32;
                line(blocks_for(t, call.items, threads), threads)
            }
            Grid::Tiled(block) => (call.tiles, block),
        }
    }

    /// The arguments of `call` slot by slot, with the bytes its operands read and write, and
    /// the elements of its first `In` and of all its `In`s.
    #[allow(clippy::type_complexity)]
    fn args_of(&self, call: &Call<'_>) -> Result<(Vec<Arg>, usize, usize, (usize, usize))> {
        if !self.dtypes.contains(&call.dtype)
            || !(self.dtypes2.is_empty() || self.dtypes2.contains(&call.dtype2))
        {
            return Err(CudaError::invalid(
                self.name,
                format!(
                    "no kernel for {} (kernels exist for {:?})",
                    self.kernel_name(call),
                    self.dtypes
                ),
            ));
        }
        let (mut operands, mut scalars) = (call.operands.iter(), call.scalars.iter());
        let (mut read, mut written, mut first_in, mut all_in) = (0, 0, None, 0);
        let mut args = Vec::with_capacity(self.args.len());
        for slot in self.args {
            let arg = match *slot {
                Slot::In(what) | Slot::Out(what) | Slot::InOut(what) => {
                    let s = operands
                        .next()
                        .ok_or_else(|| self.mismatch(format!("operand {what} missing")))?;
                    if matches!(slot, Slot::In(_) | Slot::InOut(_)) {
                        read += s.num_bytes();
                        first_in.get_or_insert(s.len());
                        all_in += s.len();
                    }
                    if matches!(slot, Slot::Out(_) | Slot::InOut(_)) {
                        written += s.num_bytes();
                    }
                    Arg::Ptr(s.ptr())
                }
                Slot::Items => Arg::I64(call.items as i64),
                _ => {
                    let a = *scalars
                        .next()
                        .ok_or_else(|| self.mismatch(format!("{slot:?} missing")))?;
                    if !slot_takes(*slot, &a) {
                        return Err(self.mismatch(format!("{slot:?} given {a:?}")));
                    }
                    a
                }
            };
            args.push(arg);
        }
        if operands.next().is_some() || scalars.next().is_some() {
            return Err(self.mismatch("more operands or scalars than slots"));
        }
        Ok((args, read, written, (first_in.unwrap_or(0), all_in)))
    }

    fn mismatch(&self, what: impl std::fmt::Display) -> CudaError {
        CudaError::invalid(
            self.name,
            format!("the call does not fit the kernel table's row ({what}): a wrapper bug"),
        )
    }

    /// The launch of a broadcasting row, `kernel(in_0, .., out, n, StridedMeta)` with `n` the
    /// elements of `shape`: every operand read through its strides (0 = broadcast), `out`
    /// contiguous over `shape` (its dtype is the caller's to check). None for an empty shape.
    /// Errors name the op `what`.
    pub fn plan_strided(
        &self,
        t: &LaunchTarget,
        what: &'static str,
        call: Call<'_>,
        ins: &[&StridedIn<'_>],
        out: DevSlice<'_>,
        shape: &[usize],
    ) -> Result<Option<Launch>> {
        let n = numel(what, shape)?;
        need_len(what, "out", &out, n)?;
        if n == 0 {
            return Ok(None);
        }
        let (cs, cst) = coalesce_operands(what, ins, shape)?;
        let meta = [Arg::Strided(StridedMeta::new(&cs, &cst)?)];
        // A broadcast operand (stride 0) is read once per distinct element.
        let read: usize = ins
            .iter()
            .zip(&cst)
            .map(|(s, st)| {
                let distinct: usize = cs
                    .iter()
                    .zip(st)
                    .filter(|(_, &x)| x != 0)
                    .map(|(&d, _)| d)
                    .product();
                distinct * s.data.dtype().size()
            })
            .sum();
        // The out operand counts as written whole: `n` elements of its dtype.
        let operands: Vec<DevSlice<'_>> = ins.iter().map(|s| s.data).chain([out]).collect();
        let call = Call {
            items: n,
            operands: &operands,
            scalars: &meta,
            read: Some(read),
            ..call
        };
        self.plan(t, &call)
    }

    /// [`Kernel::samples`] of a row whose source lives beside its op, as
    /// [`UserFile::source`]'s `check_launch` takes them.
    pub fn user_samples(&self, t: &LaunchTarget) -> Vec<UserLaunch> {
        let class = match self.source {
            Source::User(_, class) => class,
            Source::File(_) => OpClass::Elementwise,
        };
        let samples = self.samples(t).into_iter();
        samples.map(|l| to_user(l, class)).collect()
    }

    /// One launch of every kernel this row names, with fake operands: what the NVRTC test
    /// checks against the compiled PTX.
    pub fn samples(&self, t: &LaunchTarget) -> Vec<Launch> {
        let ops = (self.ops)();
        let dtypes2: &[DType] = if self.dtypes2.is_empty() {
            &[DType::F32]
        } else {
            self.dtypes2
        };
        let mut out = Vec::new();
        for op in &ops {
            for &d in self.dtypes {
                for &d2 in dtypes2 {
                    out.push(self.sample(t, op, d, d2));
                }
            }
        }
        out
    }

    fn sample(&self, t: &LaunchTarget, op: &'static str, d: DType, d2: DType) -> Launch {
        let operands: Vec<DevSlice<'static>> = self
            .args
            .iter()
            .filter(|s| matches!(s, Slot::In(_) | Slot::Out(_) | Slot::InOut(_)))
            .map(|_| fake_slice(d, 64))
            .collect();
        let scalars: Vec<Arg> = self
            .args
            .iter()
            .filter_map(|s| match s {
                Slot::In(_) | Slot::Out(_) | Slot::InOut(_) | Slot::Items => None,
                Slot::I64(_) => Some(Arg::I64(1)),
                Slot::U64(_) => Some(Arg::U64(1)),
                Slot::I32(_) => Some(Arg::I32(1)),
                Slot::F32(_) => Some(Arg::F32(1.0)),
                Slot::Ptr(_) => Some(Arg::Ptr(0)),
                Slot::Struct(_, size) => Some(Arg::Bytes(ArgBytes::zeroed(*size))),
                Slot::Strided => Some(Arg::Strided(StridedMeta::default())),
            })
            .collect();
        let call = Call {
            read: Some(0),
            ..Call::new(d, 64, &operands)
                .op(op)
                .dtype2(d2)
                .scalars(&scalars)
        };
        match self.plan(t, &call) {
            Ok(Some(l)) => l,
            other => panic!("the sample of {} does not plan: {other:?}", self.name),
        }
    }
}

/// A launch of a user row as the device takes it, declared as `class` work.
fn to_user(l: Launch, class: OpClass) -> UserLaunch {
    UserLaunch {
        kernel: l.name,
        grid: l.grid,
        block: l.block,
        shared_mem: l.shared_mem,
        args: l.args,
        declared: l.traffic.map(|t| (class, t)),
    }
}

/// One block per item, capped for grid-stride loops.
fn blocks_for(t: &LaunchTarget, items: usize, threads: u32) -> u32 {
    items.min(t.max_blocks(threads) as usize) as u32
}

fn slot_takes(slot: Slot, a: &Arg) -> bool {
    matches!(
        (slot, a),
        (Slot::I64(_), Arg::I64(_))
            | (Slot::U64(_), Arg::U64(_))
            | (Slot::I32(_), Arg::I32(_))
            | (Slot::F32(_), Arg::F32(_))
            | (Slot::Ptr(_), Arg::Ptr(_))
            | (Slot::Strided, Arg::Strided(_))
    ) || matches!((slot, a), (Slot::Struct(_, size), Arg::Bytes(b)) if b.as_slice().len() == size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{binary, copy, kernel_table, unary};

    const T: LaunchTarget = LaunchTarget { sm_count: 4 };

    #[test]
    fn name_rules_fill_every_placeholder() {
        let x = [fake_slice(DType::BF16, 8), fake_slice(DType::I64, 8)];
        let cast = Call::new(DType::BF16, 8, &x).dtype2(DType::I64);
        assert_eq!(copy::CAST.kernel_name(&cast), "cast_bf16_i64");
        let call = Call::new(DType::F16, 8, &x);
        assert_eq!(copy::STRIDED_COPY.kernel_name(&call), "strided_copy_u16");
        assert_eq!(
            unary::UNARY.kernel_name(&call.op("gelu_erf")),
            "gelu_erf_f16"
        );
        for row in kernel_table() {
            for l in row.samples(&T) {
                assert!(!l.name.contains('{'), "{}: {}", row.name, l.name);
                l.validate().unwrap();
            }
        }
    }

    #[test]
    fn calls_that_do_not_fit_their_row_are_errors() {
        let s = [fake_slice(DType::F32, 8), fake_slice(DType::F32, 8)];
        let p = [Arg::F32(1.0), Arg::F32(2.0)];
        let ok = Call::new(DType::F32, 8, &s).op("exp").scalars(&p);
        assert!(unary::UNARY.plan(&T, &ok).unwrap().is_some());
        // No kernel for i64; a scalar of the wrong type; one operand short; one scalar too many.
        let i64s = [fake_slice(DType::I64, 8), fake_slice(DType::I64, 8)];
        let no_kernel = Call::new(DType::I64, 8, &i64s).op("exp").scalars(&p);
        let err = unary::UNARY.plan(&T, &no_kernel).unwrap_err().to_string();
        assert!(err.contains("no kernel for exp_i64"), "{err}");
        let wrong = [Arg::I64(1), Arg::F32(2.0)];
        assert!(unary::UNARY.plan(&T, &ok.scalars(&wrong)).is_err());
        let short = Call {
            operands: &s[..1],
            ..ok
        };
        assert!(unary::UNARY.plan(&T, &short).is_err());
        let extra = [Arg::F32(1.0), Arg::F32(2.0), Arg::F32(3.0)];
        assert!(unary::UNARY.plan(&T, &ok.scalars(&extra)).is_err());
        // A partial-traffic row without the bytes read.
        let three = [s[0], s[1], fake_slice(DType::F32, 8)];
        let meta = [Arg::Strided(StridedMeta::default())];
        let call = Call::new(DType::F32, 8, &three).op("add").scalars(&meta);
        let err = binary::BINARY_STRIDED
            .plan(&T, &call)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no bytes read given"), "{err}");
        assert!(binary::BINARY_STRIDED
            .plan(
                &T,
                &Call {
                    read: Some(64),
                    ..call
                }
            )
            .unwrap()
            .is_some());
        // No work: no launch.
        assert!(unary::UNARY
            .plan(&T, &Call { items: 0, ..ok })
            .unwrap()
            .is_none());
    }

    #[test]
    fn geometry_and_traffic_rules() {
        let (x, y) = (fake_slice(DType::BF16, 4096), fake_slice(DType::BF16, 4096));
        let p = [Arg::F32(0.0), Arg::F32(0.0)];
        let operands = [x, y];
        let call = Call::new(DType::BF16, 4096, &operands)
            .op("exp")
            .scalars(&p);
        let l = unary::UNARY.plan(&T, &call).unwrap().unwrap();
        // Eight bf16 a thread, 256 threads a block; x read and y written once, a flop each.
        assert_eq!((l.grid, l.block), ((2, 1, 1), (256, 1, 1)));
        assert_eq!(l.traffic, Some(Traffic::bytes(8192, 8192).with_flops(4096)));
        assert_eq!(l.args[2], Arg::I64(4096));
    }
}
