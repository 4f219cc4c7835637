//! [`KeyIndex`]: which enqueued run has a key, and whether it is queued, in about 5 bytes a
//! slot.
//!
//! A sweep of a million runs looks each new key up once; a `HashMap<Hash, _>` costs 41+ bytes
//! a slot and hashes 32 bytes with SipHash. Run keys are SHA-256 digests, uniform already, so
//! their first 8 bytes are the hash, and a slot holds only the run's position (a
//! [`hashbrown::HashTable`]); the full key is compared against the run itself.

use hashbrown::HashTable;

use super::pending::PendingRun;
use crate::identity::Hash;

/// The bit of a slot that says the run is in the queue.
const QUEUED: u32 = 1 << 31;

/// The most runs a sweep holds (positions use the low 31 bits of a slot).
pub(super) const MAX_RUNS: usize = (QUEUED - 1) as usize;

/// A run key -> (position in the enqueued list, queued?) map.
#[derive(Default)]
pub(super) struct KeyIndex {
    slots: HashTable<u32>,
}

/// The hash of a key: its first 8 bytes (a SHA-256 digest is uniform).
fn hash(key: &Hash) -> u64 {
    let b = key.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

fn position(slot: u32) -> usize {
    (slot & !QUEUED) as usize
}

impl KeyIndex {
    fn slot_mut(&mut self, key: &Hash, enqueued: &[PendingRun]) -> Option<&mut u32> {
        self.slots
            .find_mut(hash(key), |s| enqueued[position(*s)].key == *key)
    }

    /// The position of the run with `key`, and whether it is queued; `None` if no run has it.
    pub(super) fn get(&mut self, key: &Hash, enqueued: &[PendingRun]) -> Option<(usize, bool)> {
        self.slot_mut(key, enqueued)
            .map(|s| (position(*s), *s & QUEUED != 0))
    }

    /// Marks the run with `key` queued or not; nothing if no run has it.
    pub(super) fn set_queued(&mut self, key: &Hash, enqueued: &[PendingRun], queued: bool) {
        if let Some(s) = self.slot_mut(key, enqueued) {
            *s = if queued { *s | QUEUED } else { *s & !QUEUED };
        }
    }

    /// Records that the run at `position` (below [`MAX_RUNS`]) of `enqueued` has `key` and is
    /// queued. The key must not be recorded yet.
    pub(super) fn insert(&mut self, key: Hash, position: usize, enqueued: &[PendingRun]) {
        debug_assert!(position < MAX_RUNS);
        let slot = position as u32 | QUEUED;
        self.slots.insert_unique(hash(&key), slot, |s| {
            hash(&enqueued[self::position(*s)].key)
        });
    }

    /// Marks every run not queued.
    pub(super) fn clear_queued(&mut self) {
        for s in self.slots.iter_mut() {
            *s &= !QUEUED;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key whose first 8 bytes are `p` and whose rest is `rest`.
    fn key(p: u64, rest: u8) -> Hash {
        let mut b = [rest; 32];
        b[..8].copy_from_slice(&p.to_le_bytes());
        Hash::from_bytes(b)
    }

    #[test]
    fn keys_that_share_a_hash_stay_apart() {
        let ks = [key(7, 1), key(7, 2), key(9, 1), key(7, 3)];
        let enq: Vec<PendingRun> = ks.iter().map(|k| PendingRun::for_test(*k)).collect();
        let mut ix = KeyIndex::default();
        for (i, k) in ks.iter().enumerate() {
            assert_eq!(ix.get(k, &enq[..i]), None);
            ix.insert(*k, i, &enq[..=i]);
        }
        for (i, k) in ks.iter().enumerate() {
            assert_eq!(ix.get(k, &enq), Some((i, true)), "key {i}");
        }
        assert_eq!(ix.get(&key(7, 4), &enq), None);
        assert_eq!(ix.get(&key(8, 1), &enq), None);
        ix.clear_queued();
        assert!(ks.iter().all(|k| ix.get(k, &enq).is_some_and(|s| !s.1)));
        ix.set_queued(&ks[1], &enq, true);
        ix.set_queued(&ks[2], &enq, true);
        let queued: Vec<bool> = ks.iter().map(|k| ix.get(k, &enq).unwrap().1).collect();
        assert_eq!(queued, [false, true, true, false]);
        ix.set_queued(&ks[1], &enq, false);
        assert_eq!(ix.get(&ks[1], &enq), Some((1, false)));
    }

    #[test]
    fn many_keys_grow_the_table_and_stay_found() {
        let ks: Vec<Hash> = (0..5000u32).map(|i| Hash::of(i.to_le_bytes())).collect();
        let enq: Vec<PendingRun> = ks.iter().map(|k| PendingRun::for_test(*k)).collect();
        let mut ix = KeyIndex::default();
        for (i, k) in ks.iter().enumerate() {
            ix.insert(*k, i, &enq[..=i]);
        }
        assert!(
            ks.iter()
                .enumerate()
                .all(|(i, k)| ix.get(k, &enq) == Some((i, true)))
        );
        assert_eq!(ix.get(&Hash::of(b"absent"), &enq), None);
    }
}
