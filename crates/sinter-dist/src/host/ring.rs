//! Collective algorithms written once over a point-to-point [`Link`] and shared by every host
//! transport (threads, TCP).
//!
//! All-reduce is a ring: a reduce-scatter (n−1 steps, each rank sends one chunk to its
//! successor and adds the chunk it receives from its predecessor) followed by an all-gather
//! (n−1 steps of forwarding finished chunks). Each rank sends 2(n−1)/n of the buffer. Every
//! chunk is reduced along one fixed path and then copied, so all ranks end bit-identical.

use crate::comm::ReduceOp;
use crate::error::Result;

/// Point-to-point messages between the members of one group for one call. Ranks are group
/// indices. Messages between a pair arrive in the order they were sent.
pub(crate) trait Link {
    fn size(&self) -> usize;
    fn me(&self) -> usize;
    fn send(&mut self, to: usize, data: &[f32]) -> Result<()>;
    /// Receives exactly `out.len()` values from `from`, overwriting `out`.
    fn recv(&mut self, from: usize, out: &mut [f32]) -> Result<()>;
    /// Receives exactly `acc.len()` values from `from` and adds them into `acc`.
    fn recv_add(&mut self, from: usize, acc: &mut [f32]) -> Result<()>;
}

/// `n + 1` chunk boundaries splitting `len` elements as evenly as possible (chunks may be
/// empty when `len < n`).
pub(crate) fn chunk_bounds(len: usize, n: usize) -> Vec<usize> {
    (0..=n)
        .map(|i| ((i as u128 * len as u128) / n as u128) as usize)
        .collect()
}

/// Ring reduce-scatter in place: afterwards chunk `me` of `buf` (boundaries `b`) holds the sum
/// over all ranks; other chunks hold partial sums.
pub(crate) fn ring_reduce_scatter<L: Link + ?Sized>(
    link: &mut L,
    buf: &mut [f32],
    b: &[usize],
) -> Result<()> {
    let n = link.size();
    let r = link.me();
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for s in 0..n.saturating_sub(1) {
        let send_c = (r + 2 * n - 1 - s) % n;
        let recv_c = (r + 2 * n - 2 - s) % n;
        link.send(next, &buf[b[send_c]..b[send_c + 1]])?;
        link.recv_add(prev, &mut buf[b[recv_c]..b[recv_c + 1]])?;
    }
    Ok(())
}

/// Ring all-gather in place: on entry chunk `me` of `buf` is this rank's, afterwards every
/// chunk holds its owner's data.
pub(crate) fn ring_all_gather<L: Link + ?Sized>(
    link: &mut L,
    buf: &mut [f32],
    b: &[usize],
) -> Result<()> {
    let n = link.size();
    let r = link.me();
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for s in 0..n.saturating_sub(1) {
        let send_c = (r + n - s) % n;
        let recv_c = (r + 2 * n - 1 - s) % n;
        link.send(next, &buf[b[send_c]..b[send_c + 1]])?;
        link.recv(prev, &mut buf[b[recv_c]..b[recv_c + 1]])?;
    }
    Ok(())
}

fn scale_avg(chunk: &mut [f32], n: usize) {
    let d = n as f32;
    for x in chunk {
        *x /= d;
    }
}

pub(crate) fn all_reduce<L: Link + ?Sized>(
    link: &mut L,
    buf: &mut [f32],
    op: ReduceOp,
) -> Result<()> {
    let n = link.size();
    if n == 1 {
        return Ok(());
    }
    let b = chunk_bounds(buf.len(), n);
    ring_reduce_scatter(link, buf, &b)?;
    if op == ReduceOp::Avg {
        let r = link.me();
        scale_avg(&mut buf[b[r]..b[r + 1]], n);
    }
    ring_all_gather(link, buf, &b)
}

/// `input.len() == n * output.len()` (checked by the caller).
pub(crate) fn reduce_scatter<L: Link + ?Sized>(
    link: &mut L,
    input: &[f32],
    output: &mut [f32],
    op: ReduceOp,
) -> Result<()> {
    let n = link.size();
    let m = output.len();
    let r = link.me();
    if n == 1 {
        output.copy_from_slice(input);
        return Ok(());
    }
    let mut scratch = input.to_vec();
    let b: Vec<usize> = (0..=n).map(|i| i * m).collect();
    ring_reduce_scatter(link, &mut scratch, &b)?;
    output.copy_from_slice(&scratch[r * m..(r + 1) * m]);
    if op == ReduceOp::Avg {
        scale_avg(output, n);
    }
    Ok(())
}

/// `output.len() == n * input.len()` (checked by the caller).
pub(crate) fn all_gather<L: Link + ?Sized>(
    link: &mut L,
    input: &[f32],
    output: &mut [f32],
) -> Result<()> {
    let n = link.size();
    let m = input.len();
    let r = link.me();
    output[r * m..(r + 1) * m].copy_from_slice(input);
    let b: Vec<usize> = (0..=n).map(|i| i * m).collect();
    ring_all_gather(link, output, &b)
}

/// Below this many elements the root sends the whole buffer to every rank; above it scatters
/// chunks and runs a ring all-gather (root sends ~1× the buffer instead of (n−1)×).
const BCAST_DIRECT_MAX: usize = 16 * 1024;

pub(crate) fn broadcast<L: Link + ?Sized>(
    link: &mut L,
    buf: &mut [f32],
    root: usize,
) -> Result<()> {
    let n = link.size();
    let r = link.me();
    if n == 1 {
        return Ok(());
    }
    if buf.len() <= BCAST_DIRECT_MAX || n == 2 {
        if r == root {
            for p in (0..n).filter(|&p| p != root) {
                link.send(p, buf)?;
            }
        } else {
            link.recv(root, buf)?;
        }
        return Ok(());
    }
    let b = chunk_bounds(buf.len(), n);
    if r == root {
        for p in (0..n).filter(|&p| p != root) {
            link.send(p, &buf[b[p]..b[p + 1]])?;
        }
    } else {
        link.recv(root, &mut buf[b[r]..b[r + 1]])?;
    }
    ring_all_gather(link, buf, &b)
}

/// Dissemination barrier: ⌈log2 n⌉ rounds of empty messages.
pub(crate) fn barrier<L: Link + ?Sized>(link: &mut L) -> Result<()> {
    let n = link.size();
    let r = link.me();
    let mut k = 1;
    while k < n {
        link.send((r + k) % n, &[])?;
        link.recv((r + n - k) % n, &mut [])?;
        k *= 2;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::chunk_bounds;

    #[test]
    fn chunk_bounds_cover_and_balance() {
        assert_eq!(chunk_bounds(10, 4), vec![0, 2, 5, 7, 10]);
        assert_eq!(chunk_bounds(2, 4), vec![0, 0, 1, 1, 2]);
        assert_eq!(chunk_bounds(0, 3), vec![0, 0, 0, 0]);
        for (len, n) in [(1001, 3), (7, 7), (5, 8)] {
            let b = chunk_bounds(len, n);
            assert_eq!((b[0], b[n]), (0, len));
            let sizes: Vec<usize> = b.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }
}
