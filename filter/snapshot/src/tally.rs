//! A gateway replica's tally: the work it has in flight on each pod, the one definition shared by
//! the filter (which serves it), the gateway sidecar (which reads it and sends it to the metrics
//! hub) and the hub (which streams every replica's latest tally to every subscriber).
//!
//! Each replica knows its own requests exactly; the engines' gauges show the others' only once a
//! scrape catches them, and never the prompt tokens still to prefill. With every replica's tally
//! in the hub's frames, each gateway sidecar sums the *other* replicas' tallies into the
//! snapshot it pushes ([`merge_peers`] → [`crate::Pod::peers`]); its own it leaves out, since
//! its filter counts its own requests itself.
//!
//! # Wire format, version 2 (integers little-endian, strings as in the snapshot)
//! ```text
//! tally    magic "LRTL" (4) | version u16 = 2 | replica u64 | seq u64 | taken_ms u64
//!          | pool_count u16                     (version 1: no seq; read as seq 0)
//! pool     name str16 | pod_count u16 | pod * pod_count
//! pod      address str8 | in_flight u32 | pending_tokens u32
//! (pool)   context_count u16 | (key u64 | pod u32 | blocks u32) * context_count
//! tallies  count u16 | (len u32 | tally) * count          (a hub frame's list)
//! ```
//! Only pods with work in flight are listed. The contexts are the long contexts the replica
//! placed most recently as new copies (on pods that held none it or the others knew of) ([`TallyContext`], a bounded ring in
//! the filter); the hub passes them on and each receiving sidecar merges the others' into
//! [`crate::Pool::peer_contexts`], so a context one replica placed is found by all. `replica` is the sender's random id (0 in what the
//! filter serves: the sidecar stamps its own); `seq` the sender's sequence number, strictly
//! increasing per replica (0 in what the filter serves; a hub refuses a tally whose `seq` is not
//! above the last it took from that replica, so a captured tally cannot be replayed); `taken_ms`
//! when the filter's counts were read. A hub takes a tally only signed with its replica's own key
//! ([`crate::auth::replica_key`]).
//!
//! # What peer work can claim
//! [`merge_peers`] caps the others' work on a pod at what its engine reports (running + waiting,
//! less this replica's own requests there) plus [`PEER_SLACK`] requests, and their pending
//! prompt tokens at [`PEER_MAX_TOKENS_PER_REQUEST`] per request counted: whatever a tally says,
//! a pod never looks fuller to the filter than its engine says by more than the slack (the
//! filter's load floor is `max(reported, own + peers)`).

use std::collections::HashMap;

use crate::{
    DecodeError, EncodeError, PeerContext, Pool, Reader, Snapshot, Writer, MAX_PEER_CONTEXTS,
    MAX_PODS_PER_POOL, MAX_POOLS,
};

/// First bytes of every tally.
pub const TALLY_MAGIC: [u8; 4] = *b"LRTL";
/// The tally format version this crate writes (it reads version 1 too, as `seq` 0).
pub const TALLY_VERSION: u16 = 2;
/// Other replicas' requests a pod may carry beyond what its engine reports (running + waiting,
/// less this replica's own there): requests sent since the last scrape, which is what the
/// tallies are for (at 20 scrapes a second, eight requests per pod in 50 ms).
pub const PEER_SLACK: u32 = 8;
/// How far a tally's `taken_ms` (or a hub frame's `created_ms`) may run ahead of the receiver's
/// clock: clocks in NTP sync disagree by far less; a timestamp further ahead is refused.
pub const MAX_CLOCK_SKEW_MS: u64 = 2_000;
/// Pending prompt tokens counted per peer request at most (a 32 Ki-token prompt).
pub const PEER_MAX_TOKENS_PER_REQUEST: u32 = 32_768;
/// Most tallies in one list (gateway replicas a hub merges).
pub const MAX_TALLIES: usize = 256;

/// Response header on the filter's tally: a number that changes whenever the tally may have
/// (a routed request, a first byte, an end, a placed context). A reader that sends it back as
/// the query parameter [`TALLY_AFTER_PARAM`] with [`TALLY_WAIT_PARAM`] is answered as soon as
/// the number differs, or when the wait ends — a long poll: the others see this replica's work
/// about a millisecond after it changes instead of up to one polling interval later, and an
/// idle proxy is asked once per wait. A filter that predates the header answers at once.
pub const TALLY_VERSION_HEADER: &str = "x-llm-router-tally-version";
/// Query parameter of the tally: the version the reader last saw.
pub const TALLY_AFTER_PARAM: &str = "after";
/// Query parameter of the tally: how long (ms) to hold the read while the version is still
/// `after`; the filter holds it at most [`MAX_TALLY_WAIT_MS`].
pub const TALLY_WAIT_PARAM: &str = "wait_ms";
/// Longest the filter holds a tally read.
pub const MAX_TALLY_WAIT_MS: u64 = 1_000;

/// One pod's share of a replica's work.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TallyPod {
    /// `ip:port` as in the snapshot.
    pub address: String,
    /// The replica's requests in flight to the pod.
    pub in_flight: u32,
    /// Their estimated prompt tokens without a first response byte yet.
    pub pending_tokens: u32,
}

/// A long context the replica placed: as [`PeerContext`] (anchor key, pod id, blocks).
pub type TallyContext = PeerContext;

/// The pods of one pool with work from this replica, and the contexts it placed there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TallyPool {
    pub name: String,
    pub pods: Vec<TallyPod>,
    pub contexts: Vec<TallyContext>,
}

/// What one gateway replica has in flight.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tally {
    /// The sending sidecar's id (0 before it is stamped).
    pub replica: u64,
    /// The sender's sequence number, strictly increasing per replica (0 before it is stamped).
    pub seq: u64,
    /// Unix time (ms) when the counts were read from the proxy.
    pub taken_ms: u64,
    pub pools: Vec<TallyPool>,
}

impl Tally {
    /// Serialises the tally.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut w = Writer {
            out: Vec::with_capacity(32 + self.pools.len() * 64),
        };
        self.write(&mut w)?;
        Ok(w.out)
    }

    fn write(&self, w: &mut Writer) -> Result<(), EncodeError> {
        if self.pools.len() > MAX_POOLS {
            return Err(EncodeError(format!(
                "too many pools in a tally: {}",
                self.pools.len()
            )));
        }
        w.out.extend_from_slice(&TALLY_MAGIC);
        w.u16(TALLY_VERSION);
        w.u64(self.replica);
        w.u64(self.seq);
        w.u64(self.taken_ms);
        w.len16(self.pools.len(), "tally pools")?;
        for pool in &self.pools {
            if pool.pods.len() > MAX_PODS_PER_POOL {
                return Err(EncodeError(format!(
                    "too many pods in tally pool {:?}: {}",
                    pool.name,
                    pool.pods.len()
                )));
            }
            w.str16(&pool.name, "tally pool name")?;
            w.len16(pool.pods.len(), "tally pods")?;
            for pod in &pool.pods {
                w.str8(&pod.address, "tally pod address")?;
                w.u32(pod.in_flight);
                w.u32(pod.pending_tokens);
            }
            crate::write_contexts(w, &pool.contexts, "tally contexts")?;
        }
        Ok(())
    }

    /// Parses bytes written by [`Tally::encode`]; nothing may follow.
    pub fn decode(bytes: &[u8]) -> Result<Tally, DecodeError> {
        let mut r = Reader { buf: bytes, pos: 0 };
        let t = Tally::read(&mut r)?;
        r.end()?;
        Ok(t)
    }

    fn read(r: &mut Reader<'_>) -> Result<Tally, DecodeError> {
        if r.take(4, "tally magic")? != TALLY_MAGIC {
            return Err(DecodeError::Invalid(
                "not a tally: magic bytes are not \"LRTL\"".into(),
            ));
        }
        let version = r.u16("tally version")?;
        if version != TALLY_VERSION && version != 1 {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let replica = r.u64("replica")?;
        let seq = if version == 1 { 0 } else { r.u64("seq")? };
        let taken_ms = r.u64("taken_ms")?;
        let pool_count = r.count("tally pools", MAX_POOLS)?;
        let mut pools = Vec::with_capacity(pool_count);
        for _ in 0..pool_count {
            let name = r.str16("tally pool name")?;
            let pod_count = r.count("tally pods", MAX_PODS_PER_POOL)?;
            let mut pods = Vec::with_capacity(pod_count);
            for _ in 0..pod_count {
                pods.push(TallyPod {
                    address: r.str8("tally pod address")?,
                    in_flight: r.u32("tally in flight")?,
                    pending_tokens: r.u32("tally pending tokens")?,
                });
            }
            let contexts = crate::read_contexts(r, "tally contexts")?;
            pools.push(TallyPool {
                name,
                pods,
                contexts,
            });
        }
        Ok(Tally {
            replica,
            seq,
            taken_ms,
            pools,
        })
    }

    /// Serialises a list of tallies (a hub frame's).
    pub fn encode_all(tallies: &[Tally]) -> Result<Vec<u8>, EncodeError> {
        if tallies.len() > MAX_TALLIES {
            return Err(EncodeError(format!("too many tallies: {}", tallies.len())));
        }
        let mut w = Writer { out: Vec::new() };
        w.len16(tallies.len(), "tallies")?;
        for t in tallies {
            let at = w.out.len();
            w.u32(0);
            t.write(&mut w)?;
            let len = u32::try_from(w.out.len() - at - 4)
                .map_err(|_| EncodeError("tally over 4 GiB".into()))?;
            if let Some(slot) = w.out.get_mut(at..at + 4) {
                slot.copy_from_slice(&len.to_le_bytes());
            }
        }
        Ok(w.out)
    }

    /// Parses bytes written by [`Tally::encode_all`]; nothing may follow.
    pub fn decode_all(bytes: &[u8]) -> Result<Vec<Tally>, DecodeError> {
        let mut r = Reader { buf: bytes, pos: 0 };
        let n = r.count("tallies", MAX_TALLIES)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let len = r.u32("tally length")? as usize;
            let body = r.take(len, "tally")?;
            out.push(Tally::decode(body)?);
        }
        r.end()?;
        Ok(out)
    }
}

/// Adds every tally but `own`'s to the pods of `snap` they name ([`crate::Pod::peers`], which
/// start from zero): the other replicas' work, never this one's, which its filter counts itself.
/// Pods or pools a tally names that the snapshot does not hold are ignored. The others'
/// contexts become each pool's [`crate::Pool::peer_contexts`] (pods named by id: the filter
/// ignores ids of pods it does not have), once per key and pod (the most blocks), by key, at most [`MAX_PEER_CONTEXTS`] (the newest
/// tallies' first). The others' work on a pod is capped (module doc, "What peer work can
/// claim"): at most the pod's running + waiting, less `own`'s requests there, plus
/// [`PEER_SLACK`]; their tokens at [`PEER_MAX_TOKENS_PER_REQUEST`] per request so counted.
/// Returns the oldest `taken_ms` among the tallies merged (`None` when none was).
pub fn merge_peers(snap: &mut Snapshot, tallies: &[Tally], own: u64) -> Option<u64> {
    for pool in &mut snap.pools {
        pool.peer_contexts.clear();
        for pod in &mut pool.pods {
            pod.peers = crate::PeerWork::default();
        }
    }
    let others: Vec<&Tally> = tallies.iter().filter(|t| t.replica != own).collect();
    if others.is_empty() {
        return None;
    }
    for pool in &mut snap.pools {
        let (mine, add) = work_on_pods(pool, tallies, &others, own);
        for (i, n, tokens) in add {
            if let Some(p) = pool.pods.get_mut(i) {
                p.peers.in_flight = p.peers.in_flight.saturating_add(n);
                p.peers.pending_tokens = p.peers.pending_tokens.saturating_add(tokens);
            }
        }
        cap_peer_work(pool, mine);
        pool.peer_contexts = peer_contexts(&pool.name, &others);
    }
    others.iter().map(|t| t.taken_ms).min()
}

/// What the tallies say is in flight on the pods of `pool`: `own`'s requests per pod (by the
/// pod's index), and each of the other replicas' entries for a pod `pool` holds as (index,
/// requests, pending tokens), in the order of `others`.
fn work_on_pods(
    pool: &Pool,
    tallies: &[Tally],
    others: &[&Tally],
    own: u64,
) -> (Vec<u32>, Vec<(usize, u32, u32)>) {
    let index: HashMap<&str, usize> = pool
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.address.as_str(), i))
        .collect();
    let mut add: Vec<(usize, u32, u32)> = Vec::new();
    let mut mine: Vec<u32> = vec![0; pool.pods.len()];
    for t in tallies.iter().filter(|t| t.replica == own) {
        for tp in t.pools.iter().filter(|tp| tp.name == pool.name) {
            for pod in &tp.pods {
                if let Some(m) = index
                    .get(pod.address.as_str())
                    .and_then(|&i| mine.get_mut(i))
                {
                    *m = m.saturating_add(pod.in_flight);
                }
            }
        }
    }
    for t in others {
        for tp in t.pools.iter().filter(|tp| tp.name == pool.name) {
            for pod in &tp.pods {
                if let Some(&i) = index.get(pod.address.as_str()) {
                    add.push((i, pod.in_flight, pod.pending_tokens));
                }
            }
        }
    }
    (mine, add)
}

/// Caps the others' work on each pod of `pool` (module doc, "What peer work can claim"), given
/// this replica's own requests there (`mine`, by pod index).
fn cap_peer_work(pool: &mut Pool, mine: Vec<u32>) {
    for (p, mine) in pool.pods.iter_mut().zip(mine) {
        let reported = p.running.saturating_add(p.waiting);
        let cap = reported.saturating_sub(mine).saturating_add(PEER_SLACK);
        p.peers.in_flight = p.peers.in_flight.min(cap);
        p.peers.pending_tokens = p.peers.pending_tokens.min(
            p.peers
                .in_flight
                .saturating_mul(PEER_MAX_TOKENS_PER_REQUEST),
        );
    }
}

/// The contexts `others` placed on the pool named `pool`: once per key and pod (the most
/// blocks), at most [`MAX_PEER_CONTEXTS`] (the newest tallies' first), sorted by key.
fn peer_contexts(pool: &str, others: &[&Tally]) -> Vec<PeerContext> {
    let mut newest_first: Vec<&Tally> = others.to_vec();
    newest_first.sort_by_key(|t| std::cmp::Reverse(t.taken_ms));
    let mut contexts: HashMap<(u64, u32), u32> = HashMap::new();
    for t in newest_first {
        for tp in t.pools.iter().filter(|tp| tp.name == pool) {
            for c in tp.contexts.iter() {
                if contexts.len() >= MAX_PEER_CONTEXTS && !contexts.contains_key(&(c.key, c.pod)) {
                    continue;
                }
                let blocks = contexts.entry((c.key, c.pod)).or_insert(0);
                *blocks = (*blocks).max(c.blocks);
            }
        }
    }
    let mut out: Vec<PeerContext> = contexts
        .into_iter()
        .map(|((key, pod), blocks)| PeerContext { key, pod, blocks })
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::{PeerWork, Pod, Pool};

    fn tally(replica: u64, taken_ms: u64, pods: &[(&str, u32, u32)]) -> Tally {
        Tally {
            replica,
            seq: taken_ms,
            taken_ms,
            pools: vec![TallyPool {
                name: "p".into(),
                pods: pods
                    .iter()
                    .map(|&(a, n, t)| TallyPod {
                        address: a.into(),
                        in_flight: n,
                        pending_tokens: t,
                    })
                    .collect(),
                contexts: Vec::new(),
            }],
        }
    }

    fn snap() -> Snapshot {
        let pod = |a: &str| Pod {
            address: a.into(),
            peers: PeerWork {
                in_flight: 99,
                pending_tokens: 99,
            },
            ..Pod::default()
        };
        Snapshot {
            rewrites: None,
            objectives: None,
            generation: 1,
            created_ms: 1,
            pools: vec![Pool {
                name: "p".into(),
                cluster: "c".into(),
                models: vec!["m".into()],
                pods: vec![pod("10.0.0.1:8000"), pod("10.0.0.2:8000")],
                peer_contexts: Vec::new(),
            }],
        }
    }

    #[test]
    fn tallies_round_trip_alone_and_as_a_list() {
        let a = tally(7, 1_000, &[("10.0.0.1:8000", 3, 4_096)]);
        let b = tally(9, 1_010, &[]);
        assert_eq!(Tally::decode(&a.encode().unwrap()).unwrap(), a);
        let list = Tally::encode_all(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(Tally::decode_all(&list).unwrap(), vec![a.clone(), b]);
        // Truncated, trailing or foreign bytes are refused, never half-read.
        assert!(Tally::decode_all(&list[..list.len() - 1]).is_err());
        let mut extra = a.encode().unwrap();
        extra.push(0);
        assert!(Tally::decode(&extra).is_err());
        assert!(Tally::decode(b"LRSN\x01\x00").is_err());
    }

    #[test]
    fn a_replicas_own_share_is_never_counted_and_the_others_add_up() {
        let mut s = snap();
        let oldest = merge_peers(
            &mut s,
            &[
                tally(1, 500, &[("10.0.0.1:8000", 5, 5_000)]), // ours
                tally(2, 480, &[("10.0.0.1:8000", 2, 1_000)]),
                tally(
                    3,
                    490,
                    &[("10.0.0.1:8000", 1, 300), ("10.0.0.9:8000", 4, 4)],
                ),
            ],
            1,
        );
        let pods = &s.pools[0].pods;
        assert_eq!(
            pods[0].peers,
            PeerWork {
                in_flight: 3,
                pending_tokens: 1_300
            }
        );
        // Stale values are replaced, not added to; an unknown pod is ignored.
        assert_eq!(pods[1].peers, PeerWork::default());
        assert_eq!(oldest, Some(480));
        // Only our own tally: nothing from peers.
        let mut s = snap();
        assert_eq!(
            merge_peers(&mut s, &[tally(1, 5, &[("10.0.0.1:8000", 5, 5)])], 1),
            None
        );
        assert!(s.pools[0].pods.iter().all(|p| p.peers.is_none()));
    }

    /// A forged or leaking tally claiming huge work makes a pod look fuller than its engine
    /// says by at most the slack (with this replica's own requests there not counted twice).
    #[test]
    fn peer_work_is_capped_at_what_the_engine_reports_plus_the_slack() {
        let mut s = snap();
        s.pools[0].pods[0].running = 10;
        s.pools[0].pods[0].waiting = 2;
        merge_peers(
            &mut s,
            &[
                tally(1, 500, &[("10.0.0.1:8000", 4, 0)]), // ours: 4 of the engine's 12
                tally(2, 480, &[("10.0.0.1:8000", u32::MAX, u32::MAX)]),
                tally(3, 490, &[("10.0.0.2:8000", 1_000, 1_000)]),
            ],
            1,
        );
        let pods = &s.pools[0].pods;
        assert_eq!(pods[0].peers.in_flight, 12 - 4 + PEER_SLACK);
        assert_eq!(
            pods[0].peers.pending_tokens,
            (12 - 4 + PEER_SLACK) * PEER_MAX_TOKENS_PER_REQUEST
        );
        // An idle pod (its engine reports nothing): the slack only.
        assert_eq!(pods[1].peers.in_flight, PEER_SLACK);
        assert_eq!(pods[1].peers.pending_tokens, 1_000);
        // Honest work within the bound is untouched.
        let mut s = snap();
        s.pools[0].pods[0].running = 3;
        merge_peers(&mut s, &[tally(2, 480, &[("10.0.0.1:8000", 3, 900)])], 1);
        assert_eq!(s.pools[0].pods[0].peers.in_flight, 3);
        assert_eq!(s.pools[0].pods[0].peers.pending_tokens, 900);
    }

    #[test]
    fn the_sequence_is_signed_data_and_version_1_still_reads() {
        let mut a = tally(7, 1_000, &[("10.0.0.1:8000", 3, 4_096)]);
        a.seq = 123_456;
        let bytes = a.encode().unwrap();
        assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), TALLY_VERSION);
        assert_eq!(Tally::decode(&bytes).unwrap().seq, 123_456);
        // Version 1 (what an older filter serves): no seq, read as 0.
        let mut v1 = bytes[..14].to_vec();
        v1[4] = 1;
        v1.extend_from_slice(&bytes[22..]);
        let old = Tally::decode(&v1).unwrap();
        assert_eq!((old.replica, old.seq, old.taken_ms), (7, 0, 1_000));
        let mut v3 = bytes.clone();
        v3[4] = 3;
        assert!(Tally::decode(&v3).is_err());
    }

    fn placed(replica: u64, taken_ms: u64, contexts: &[(u64, u32, u32)]) -> Tally {
        let mut t = tally(replica, taken_ms, &[]);
        t.pools[0].contexts = contexts
            .iter()
            .map(|&(key, pod, blocks)| TallyContext { key, pod, blocks })
            .collect();
        t
    }

    #[test]
    fn the_others_placed_contexts_are_merged_once_by_key_and_travel_in_the_snapshot() {
        let mut s = snap();
        merge_peers(&mut s, &[], 1);
        let plain = s.encode().unwrap();
        let a = placed(2, 480, &[(30, 1, 64), (10, 2, 100), (20, 1, 50)]);
        let b = placed(3, 490, &[(10, 2, 120), (10, 3, 80)]);
        let ours = placed(1, 500, &[(40, 1, 10)]);
        assert_eq!(Tally::decode(&a.encode().unwrap()).unwrap(), a);
        merge_peers(&mut s, &[ours.clone(), a, b], 1);
        let got: Vec<(u64, u32, u32)> = s.pools[0]
            .peer_contexts
            .iter()
            .map(|c| (c.key, c.pod, c.blocks))
            .collect();
        // Ours left out; the same key and pod once, with the most blocks; by key.
        assert_eq!(
            got,
            vec![(10, 2, 120), (10, 3, 80), (20, 1, 50), (30, 1, 64)]
        );
        let with = s.encode().unwrap();
        assert_eq!(
            u16::from_le_bytes([with[6], with[7]]),
            crate::FLAG_PEER_CONTEXTS
        );
        assert_eq!(with.len(), plain.len() + 2 + 4 * 16);
        assert_eq!(Snapshot::decode(&with).unwrap(), s);
        assert!(!s.same_state(&Snapshot::decode(&plain).unwrap()));
        // Merged again without them: gone, and the bytes are the plain ones.
        merge_peers(&mut s, &[ours], 1);
        assert_eq!(s.encode().unwrap(), plain);
        // More than a pool may carry is refused by both ends.
        let many: Vec<(u64, u32, u32)> = (0..=crate::MAX_PEER_CONTEXTS as u64)
            .map(|k| (k, 1, 1))
            .collect();
        merge_peers(&mut s, &[placed(2, 1, &many)], 1);
        assert_eq!(s.pools[0].peer_contexts.len(), crate::MAX_PEER_CONTEXTS);
        assert!(placed(2, 1, &many).encode().is_err());
    }

    #[test]
    fn peer_work_travels_in_the_snapshot_only_when_there_is_some() {
        let mut s = snap();
        merge_peers(&mut s, &[], 1);
        let plain = s.encode().unwrap();
        assert_eq!(u16::from_le_bytes([plain[6], plain[7]]), 0, "no flag");
        merge_peers(&mut s, &[tally(2, 5, &[("10.0.0.2:8000", 2, 77)])], 1);
        let with = s.encode().unwrap();
        assert_eq!(
            u16::from_le_bytes([with[6], with[7]]),
            crate::FLAG_PEER_WORK
        );
        assert_eq!(with.len(), plain.len() + 2 * 8);
        let back = Snapshot::decode(&with).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.pools[0].pods[1].peers.pending_tokens, 77);
        assert!(!back.same_state(&Snapshot::decode(&plain).unwrap()));
        // A flag this build does not know is still refused.
        let mut odd = with.clone();
        odd[6] |= 0x10;
        assert!(matches!(
            Snapshot::decode(&odd),
            Err(DecodeError::UnsupportedFlags(_))
        ));
    }
}
