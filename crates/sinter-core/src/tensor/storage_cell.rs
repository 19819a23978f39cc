//! A tensor's shared storage behind its lock, with a stamp that changes on every write.
//!
//! Caches derived from a tensor's values (the host step's packed weights) keep the stamp they
//! were made from and are valid while it is unchanged: every way of changing a CPU storage's
//! values — an in-place op, an optimizer step, a host view for writing, a move to another
//! device — goes through [`StorageCell::write`], which counts (its vectors are reachable for
//! writing only through that lock). A CUDA kernel may write an output view under a read
//! guard, so stamps vouch for CPU data only. The id tells storages apart for the life of the
//! process (an address could be reused after a free).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LockResult, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::storage::Storage;

pub(crate) struct StorageCell {
    lock: RwLock<Storage>,
    id: u64,
    writes: AtomicU64,
}

/// Which storage and how many times it had been opened for writing (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StorageStamp {
    pub id: u64,
    pub writes: u64,
}

impl StorageCell {
    pub(crate) fn new(storage: Storage) -> StorageCell {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        StorageCell {
            lock: RwLock::new(storage),
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            writes: AtomicU64::new(0),
        }
    }

    pub(crate) fn read(&self) -> LockResult<RwLockReadGuard<'_, Storage>> {
        self.lock.read()
    }

    /// The write lock; counted before it is taken, so a reader that holds the read lock and
    /// sees an unchanged stamp knows that no write has happened since the stamp was taken.
    pub(crate) fn write(&self) -> LockResult<RwLockWriteGuard<'_, Storage>> {
        self.writes.fetch_add(1, Ordering::AcqRel);
        self.lock.write()
    }

    pub(crate) fn into_inner(self) -> LockResult<Storage> {
        self.lock.into_inner()
    }

    pub(crate) fn stamp(&self) -> StorageStamp {
        StorageStamp {
            id: self.id,
            writes: self.writes.load(Ordering::Acquire),
        }
    }
}
