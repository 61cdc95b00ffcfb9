//! One pool, one order across Envoy workers: each worker holds the streams it paused, and
//! publishes per pool what it holds — the enqueue time of its oldest waiting request per
//! priority class — in one shared-data key. A worker dispatches its head only when no other
//! worker holds older work of the same class or any work of a higher class ([`ahead`]); the
//! admitted work itself is shared already (the in-flight tables). A worker's entry older than
//! `summary_stale_ms` is ignored and dropped at the next write: a worker that stopped cannot
//! hold the others.
//!
//! Encoding (little-endian): `b'Q' | version u8 = 1 | count u8 | (worker u64 | updated_ms u64 |
//! oldest 3 × u64 (0 = none)) * count`. A value that does not decode reads as empty.

use super::Queue;
use crate::priority::Class;
use crate::store::SharedStore;
use crate::wire::Reader;

const TAG: [u8; 2] = [b'Q', 1];
/// Workers remembered per pool at most (Envoy runs one VM per worker thread).
pub const MAX_SLOTS: usize = 128;

/// Shared-data key of a pool's queue summary.
pub fn key(pool: &str) -> String {
    format!("llmr/fq/{pool}")
}

/// One worker's entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slot {
    pub worker: u64,
    pub updated_ms: u64,
    /// Enqueue time of the oldest waiting request per class (`[sheddable, standard,
    /// critical]`; 0 = none).
    pub oldest: [u64; 3],
}

pub fn decode(bytes: &[u8]) -> Vec<Slot> {
    let mut r = Reader(bytes);
    let mut out = Vec::new();
    if r.array::<2>() != Some(TAG) {
        return out;
    }
    let Some(n) = r.u8() else {
        return out;
    };
    for _ in 0..n {
        let (Some(worker), Some(updated_ms), Some(a), Some(b), Some(c)) =
            (r.u64(), r.u64(), r.u64(), r.u64(), r.u64())
        else {
            return Vec::new();
        };
        out.push(Slot {
            worker,
            updated_ms,
            oldest: [a, b, c],
        });
    }
    out
}

pub fn encode(slots: &[Slot]) -> Vec<u8> {
    let n = slots.len().min(MAX_SLOTS);
    let mut out = Vec::with_capacity(3 + n * 40);
    out.extend_from_slice(&TAG);
    out.push(n as u8);
    for s in slots.iter().take(n) {
        out.extend_from_slice(&s.worker.to_le_bytes());
        out.extend_from_slice(&s.updated_ms.to_le_bytes());
        for o in s.oldest {
            out.extend_from_slice(&o.to_le_bytes());
        }
    }
    out
}

/// Shared-data key of the proxy's worker counter ([`worker_id`]).
pub const WORKER_SEQ_KEY: &str = "llmr/fq-workers";

/// An id for a worker starting at `now_ns`, distinct from every other worker's of this proxy:
/// a counter in shared data taken by compare-and-swap (the high half) with the start time's
/// low bits (the low half). The clock alone is not enough — workers configured in the same
/// nanosecond (or on a host whose clock a test holds still) would share one id, and a worker
/// filters its own id out of the others' entries, so each would overwrite the other's and
/// neither would wait for the other's older work; the counter alone is not either, since the
/// very first claim cannot be compared-and-swapped (the key does not exist yet).
pub fn worker_id(store: &impl SharedStore, now_ns: u64) -> u64 {
    let mut seq = 0u64;
    for _ in 0..8 {
        let (cur, cas) = match store.get(WORKER_SEQ_KEY) {
            Some((v, cas)) => (Reader(&v).u64().unwrap_or(0), Some(cas)),
            None => (0, None),
        };
        if store
            .set(WORKER_SEQ_KEY, &(cur + 1).to_le_bytes(), cas)
            .is_ok()
        {
            seq = cur + 1;
            break;
        }
    }
    (seq << 32) ^ (now_ns & 0xffff_ffff) | 1
}

/// Writes worker `me`'s entry (removed when it holds nothing), drops stale ones, and returns
/// the other workers' fresh entries. A write lost to contention five times is skipped: the next
/// tick writes again.
pub fn publish(
    store: &impl SharedStore,
    pool: &str,
    me: u64,
    oldest: [Option<u64>; 3],
    now_ms: u64,
    stale_ms: u64,
) -> Vec<Slot> {
    let k = key(pool);
    let mine = oldest.map(|o| o.map_or(0, |t| t.max(1)));
    let mut others = Vec::new();
    for _ in 0..5 {
        let (slots, cas) = match store.get(&k) {
            Some((v, cas)) => (decode(&v), Some(cas)),
            None => (Vec::new(), None),
        };
        others = slots
            .into_iter()
            .filter(|s| s.worker != me && now_ms.saturating_sub(s.updated_ms) <= stale_ms)
            .take(MAX_SLOTS - 1)
            .collect();
        let mut all = others.clone();
        if mine.iter().any(|&t| t > 0) {
            all.push(Slot {
                worker: me,
                updated_ms: now_ms,
                oldest: mine,
            });
        }
        if cas.is_none() && all.is_empty() {
            break;
        }
        if store.set(&k, &encode(&all), cas).is_ok() {
            break;
        }
    }
    others
}

/// Reads the other workers' fresh entries without writing.
pub fn read(
    store: &impl SharedStore,
    pool: &str,
    me: u64,
    now_ms: u64,
    stale_ms: u64,
) -> Vec<Slot> {
    store
        .get(&key(pool))
        .map(|(v, _)| decode(&v))
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.worker != me && now_ms.saturating_sub(s.updated_ms) <= stale_ms)
        .collect()
}

/// Name of worker `id`'s wake-up queue (a proxy-wasm shared queue it registers): another
/// worker whose stream frees room on a pod enqueues the pool's name there, and the host calls
/// the owner's root context (`on_queue_ready`) on the owner's own thread, where it can resume a
/// paused stream. One queue per worker because a shared queue calls back only the context
/// that registered it last: one queue for all would wake one worker.
pub fn wake_queue(id: u64) -> String {
    format!("llmr/wake/{id:016x}")
}

/// The other workers to wake when room frees on worker `me`'s pod of `pool`: those whose
/// entries say they hold waiting requests and are fresh at `now_ms` (read only when there is
/// such an entry, so a pool nobody waits for costs one shared-data read and no clock).
pub fn to_wake(
    store: &impl SharedStore,
    pool: &str,
    me: u64,
    now_ms: impl FnOnce() -> u64,
    stale_ms: u64,
) -> Vec<u64> {
    let Some((v, _)) = store.get(&key(pool)) else {
        return Vec::new();
    };
    let mut waiting = decode(&v);
    waiting.retain(|s| s.worker != me && s.oldest.iter().any(|&o| o > 0));
    if waiting.is_empty() {
        return Vec::new();
    }
    let now = now_ms();
    waiting
        .into_iter()
        .filter(|s| now.saturating_sub(s.updated_ms) <= stale_ms)
        .map(|s| s.worker)
        .collect()
}

/// Whether another worker holds work that goes before worker `me`'s next dispatch from its
/// `queue` at `now_ms`: [`ahead`] for the class of its head, on its *oldest* entry of that
/// class — the time it publishes — not on the head itself. The head is the worker's fairness
/// choice (round robin between ids) and may be newer than its oldest; judging it against the
/// others' oldest would let two workers, each holding an old request of one tenant behind a
/// newer one of another, defer to each other until the requests time out. Judged this way
/// exactly one worker — the one holding the oldest work of the highest class — goes.
pub fn ahead_of<T>(others: &[Slot], me: u64, queue: &Queue<T>, now_ms: u64) -> bool {
    let Some(head) = queue.peek(now_ms) else {
        return false;
    };
    let class = Class::of(head.priority).index();
    let oldest = queue
        .oldest()
        .get(class)
        .copied()
        .flatten()
        .unwrap_or(head.enqueued_ms);
    ahead(others, me, class, oldest, queue.standing_before(now_ms))
}

/// Whether another worker holds work that goes before worker `me`'s head (of class index
/// `class`, enqueued at `enqueued_ms`): any work of a higher class, or older work of the same
/// class (equal times: the lower worker id first, so exactly one worker goes). Same-class work
/// enqueued before `standing_before` does not count: it is standing, and its worker serves
/// newest first ([`Queue`]'s adaptive order; 0 = nothing is standing).
pub fn ahead(
    others: &[Slot],
    me: u64,
    class: usize,
    enqueued_ms: u64,
    standing_before: u64,
) -> bool {
    let t = enqueued_ms.max(1);
    others.iter().any(|s| {
        let higher = s
            .oldest
            .iter()
            .enumerate()
            .any(|(c, &o)| c > class && o > 0);
        let same = s.oldest.get(class).copied().unwrap_or(0);
        let same = if same < standing_before { 0 } else { same };
        higher || (same > 0 && (same < t || (same == t && s.worker < me)))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn older_or_higher_work_elsewhere_goes_first_and_stale_workers_are_ignored() {
        let store = MemoryStore::new();
        // Worker 1 holds a standard request from t=100; worker 2's head is from t=150.
        let others = publish(&store, "p", 1, [None, Some(100), None], 1000, 500);
        assert!(others.is_empty());
        let others = publish(&store, "p", 2, [None, Some(150), None], 1010, 500);
        assert_eq!(others.len(), 1);
        assert!(ahead(&others, 2, 1, 150, 0), "worker 1's is older");
        assert!(!ahead(&others, 2, 2, 150, 0), "a critical head goes first");
        let others = read(&store, "p", 1, 1020, 500);
        assert!(!ahead(&others, 1, 1, 100, 0), "worker 1 holds the oldest");
        assert!(
            ahead(&others, 1, 0, 10, 0),
            "a sheddable head waits for standard work"
        );
        // Worker 1 stops publishing: after the staleness bound it holds nobody.
        let others = read(&store, "p", 2, 1600, 500);
        assert!(!ahead(&others, 2, 1, 150, 0));
        // An emptied worker removes its entry.
        publish(&store, "p", 2, [None; 3], 1600, 500);
        assert!(decode(&store.get(&key("p")).unwrap().0).is_empty());
    }

    #[test]
    fn room_freed_here_wakes_the_other_workers_that_hold_waiting_work_and_only_them() {
        let store = MemoryStore::new();
        let reads = std::cell::Cell::new(0);
        let clock_read = &reads;
        let at = |t: u64| {
            move || {
                clock_read.set(clock_read.get() + 1);
                t
            }
        };
        // Nobody has published: nothing to wake, and the clock is not read.
        assert!(to_wake(&store, "p", 1, at(1000), 500).is_empty());
        // Worker 1 alone holds work: it is not woken by its own streams.
        publish(&store, "p", 1, [None, Some(100), None], 1000, 500);
        publish(&store, "p", 2, [None; 3], 1000, 500);
        assert!(to_wake(&store, "p", 1, at(1000), 500).is_empty());
        assert_eq!(clock_read.get(), 0, "no one else waits: no clock read");
        // Workers 1 and 3 hold work; worker 2's stream frees room: both are woken.
        publish(&store, "p", 3, [Some(90), None, None], 1010, 500);
        assert_eq!(to_wake(&store, "p", 2, at(1020), 500), vec![1, 3]);
        assert_eq!(to_wake(&store, "p", 3, at(1020), 500), vec![1]);
        // Another pool's room wakes nobody here.
        assert!(to_wake(&store, "q", 2, at(1020), 500).is_empty());
        // A worker that stopped publishing is not woken once its entry is stale.
        assert_eq!(to_wake(&store, "p", 2, at(1505), 500), vec![3]);
        // Each worker's queue has its own name.
        assert_ne!(wake_queue(1), wake_queue(3));
    }

    #[test]
    fn two_workers_whose_heads_are_newer_than_their_oldest_never_both_defer() {
        use crate::flow::{FlowConfig, Pushed};
        // Each worker holds an old request of tenant `heavy` and, in front of it by the round
        // robin between ids, a newer one of `light` (popping `heavy` first moved its flow back).
        let cfg = FlowConfig::default();
        let worker = |old: u64, new: u64| {
            let mut q: Queue<()> = Queue::default();
            for (key, id, t) in [
                (old, "heavy", old),
                (old + 1, "heavy", old + 1),
                (new, "light", new),
            ] {
                assert!(matches!(
                    q.push(&cfg, key, 0, id, 10, t, ()),
                    Pushed::Queued { .. }
                ));
            }
            q.pop(0);
            assert_eq!(q.peek(0).map(|e| e.enqueued_ms), Some(new));
            assert_eq!(q.oldest()[1], Some(old + 1));
            q
        };
        let (a, b) = (worker(100, 300), worker(200, 250));
        let store = MemoryStore::new();
        let oa = publish(&store, "p", 1, a.oldest(), 1000, 5000);
        let ob = publish(&store, "p", 2, b.oldest(), 1000, 5000);
        let oa = [oa, read(&store, "p", 1, 1000, 5000)].concat();
        // Judged on their heads, each sees older work at the other: both wait, nobody goes.
        let head = |q: &Queue<()>| q.peek(0).map_or(0, |e| e.enqueued_ms);
        assert!(ahead(&oa, 1, 1, head(&a), 0) && ahead(&ob, 2, 1, head(&b), 0));
        // Judged on their oldest, exactly one goes: worker 1, which holds the oldest.
        assert!(!ahead_of(&oa, 1, &a, 1000));
        assert!(ahead_of(&ob, 2, &b, 1000));
        assert!(
            !ahead_of(&ob, 2, &Queue::<()>::default(), 1000),
            "nothing to send"
        );
    }

    #[test]
    fn a_worker_whose_work_stands_holds_nobody_of_its_class() {
        let store = MemoryStore::new();
        // Worker 1's oldest standard request is from t=100; worker 2's from t=5,000.
        publish(&store, "p", 1, [None, Some(100), None], 6_000, 5_000);
        let others = publish(&store, "p", 2, [None, Some(5_000), None], 6_000, 5_000);
        assert!(ahead(&others, 2, 1, 5_000, 0), "first come first served");
        // Standing before t=1,000: worker 1 serves its newest first and holds nobody back.
        assert!(!ahead(&others, 2, 1, 5_000, 1_000));
        // Its work is still ahead of a lower class.
        assert!(ahead(&others, 2, 0, 5_000, 1_000));
    }

    #[test]
    fn workers_started_at_the_same_instant_get_different_ids() {
        let store = MemoryStore::new();
        let ids: Vec<u64> = (0..4).map(|_| worker_id(&store, 1_000)).collect();
        for (i, a) in ids.iter().enumerate() {
            assert!(ids.iter().skip(i + 1).all(|b| a != b), "{ids:?}");
            assert_ne!(*a, 0);
        }
    }

    #[test]
    fn encoding_round_trips_and_garbage_reads_empty() {
        let s = [Slot {
            worker: 7,
            updated_ms: 9,
            oldest: [0, 3, 4],
        }];
        assert_eq!(decode(&encode(&s)), s.to_vec());
        assert!(decode(b"junk").is_empty());
        assert!(decode(&encode(&s)[..20]).is_empty());
    }
}
