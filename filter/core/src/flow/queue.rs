//! One pool's wait queue: strict priority between bands, round robin between fairness ids
//! within a band, first come first served within an id; bounded per class and in total.
//!
//! First come first served within an id holds while the queue absorbs a burst. Once an id's
//! oldest request has waited longer than `flow.newest_first_after_ms`, the queue is standing,
//! not absorbing: served in arrival order, every request behind would wait as long and be
//! late too. That id's newest request then goes first (adaptive LIFO, as Facebook's RPC
//! servers do under overload: "Fail at Scale", ACM Queue 13(8), 2015), so the requests served
//! are the fresh ones, and the stale ones wait for a lull or their time to live. When the id's
//! queue empties, or its oldest has gone, it is first come first served again.
//!
//! A request may carry its own deadline: its time-to-first-token objective (llm-d's
//! `x-slo-ttft-ms` header), counted from its arrival. Held past it, it cannot meet it: it is
//! refused then ([`Refusal::Late`]) rather than at its class's time to live. And one that arrives
//! behind more waiting work than the queue dispatches before its deadline (at the pace this
//! queue has dispatched at while it was not empty) is refused at once: under a standing
//! overload the queue then holds only work it can still serve in time, and the client hears
//! 429 at once instead of after its deadline. Without a deadline nothing changes. (The deadline
//! also bounds which pods may take the request: [`crate::flow::admit`].)
//!
//! The queue holds opaque items (the glue's paused streams), each with a key (to remove it
//! when its client hangs up), its body size and its enqueue time. Memory is bounded by the
//! limits: at most `max_requests` entries whatever the load, and no fairness id or band
//! outlives its last entry.

use crate::config::{BandLimits, FlowConfig};
use crate::priority::Class;
use std::collections::{BTreeMap, VecDeque};

/// Why a request was not queued (or was taken out of the queue unserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its class, or the whole queue, holds `max_requests`.
    Full,
    /// Its class, or the whole queue, holds `max_bytes`.
    Bytes,
    /// It waited longer than its class's time to live.
    Expired,
    /// A request of a higher class took its place.
    Displaced,
    /// Its own deadline passed while it waited, or the work ahead of it would outlast it.
    Late,
}

impl Refusal {
    /// The reason header value of the 429.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Full => "rejected-queue-full",
            Refusal::Bytes => "rejected-queue-bytes",
            Refusal::Expired => "rejected-queue-timeout",
            Refusal::Displaced => "rejected-displaced",
            Refusal::Late => "rejected-deadline",
        }
    }

    /// The `outcome` label of `llm_router_flow_requests_total`.
    pub fn outcome(self) -> &'static str {
        match self {
            Refusal::Full => "queue_full",
            Refusal::Bytes => "queue_bytes",
            Refusal::Expired => "queue_timeout",
            Refusal::Displaced => "displaced",
            Refusal::Late => "deadline",
        }
    }
}

/// A waiting request.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<T> {
    pub key: u64,
    pub priority: i32,
    pub bytes: usize,
    pub enqueued_ms: u64,
    /// When it can no longer meet its own objective (host ms), if it stated one.
    pub deadline_ms: Option<u64>,
    pub item: T,
}

#[derive(Debug, Clone)]
struct Flow<T> {
    id: String,
    entries: VecDeque<Entry<T>>,
}

/// The requests of one priority: one FIFO per fairness id, served in turn.
#[derive(Debug, Clone)]
pub struct Band<T> {
    flows: VecDeque<Flow<T>>,
}

impl<T> Default for Band<T> {
    fn default() -> Self {
        Band {
            flows: VecDeque::new(),
        }
    }
}

/// What [`Queue::push`] did.
#[derive(Debug, PartialEq)]
pub enum Pushed<T> {
    /// Queued; `displaced` was taken out to make room (refuse it with [`Refusal::Displaced`]).
    Queued { displaced: Option<Entry<T>> },
    /// Not queued: the item comes back with the reason.
    Refused(Refusal, T),
}

/// One pool's waiting requests.
#[derive(Debug, Clone)]
pub struct Queue<T> {
    /// By priority; iterated from the highest.
    bands: BTreeMap<i32, Band<T>>,
    counts: [usize; 3],
    bytes: [usize; 3],
    /// When the last dispatch was, while the queue has not been empty since (host ms).
    last_dispatch_ms: Option<u64>,
    /// Decayed mean time between two dispatches while requests waited (ms; 0 = unknown).
    pace_ms: f64,
    /// `flow.newest_first_after_ms` of the configuration last pushed with (0: never).
    newest_first_after_ms: u64,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            bands: BTreeMap::new(),
            counts: [0; 3],
            bytes: [0; 3],
            last_dispatch_ms: None,
            pace_ms: 0.0,
            newest_first_after_ms: 0,
        }
    }
}

/// Weight of a new interval in [`Queue::pace_ms`].
const PACE_ALPHA: f64 = 0.2;

fn at(a: &[usize; 3], c: Class) -> usize {
    a.get(c.index()).copied().unwrap_or(0)
}

fn add(a: &mut [usize; 3], c: Class, n: usize, up: bool) {
    if let Some(v) = a.get_mut(c.index()) {
        *v = if up {
            v.saturating_add(n)
        } else {
            v.saturating_sub(n)
        };
    }
}

impl<T> Queue<T> {
    pub fn len(&self) -> usize {
        self.counts.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests waiting in `class`.
    pub fn count(&self, class: Class) -> usize {
        at(&self.counts, class)
    }

    /// Body bytes held in `class`.
    pub fn bytes(&self, class: Class) -> usize {
        at(&self.bytes, class)
    }

    fn total_bytes(&self) -> usize {
        self.bytes.iter().sum()
    }

    /// Queues `item` (key `key`, `bytes` of body) at `now_ms` under the limits of `cfg`.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        cfg: &FlowConfig,
        key: u64,
        priority: i32,
        fairness_id: &str,
        bytes: usize,
        now_ms: u64,
        item: T,
    ) -> Pushed<T> {
        self.push_until(cfg, key, priority, fairness_id, bytes, now_ms, None, item)
    }

    /// [`Queue::push`] for a request that must be dispatched by `deadline_ms` (its own
    /// objective): refused with [`Refusal::Late`] when the requests that go before it would
    /// take longer than that at the queue's dispatch pace.
    #[allow(clippy::too_many_arguments)]
    pub fn push_until(
        &mut self,
        cfg: &FlowConfig,
        key: u64,
        priority: i32,
        fairness_id: &str,
        bytes: usize,
        now_ms: u64,
        deadline_ms: Option<u64>,
        item: T,
    ) -> Pushed<T> {
        self.newest_first_after_ms = cfg.newest_first_after_ms;
        if let Some(deadline) = deadline_ms {
            let wait = self.predicted_wait_ms(priority);
            if deadline <= now_ms || wait.is_some_and(|w| now_ms as f64 + w > deadline as f64) {
                return Pushed::Refused(Refusal::Late, item);
            }
        }
        let class = Class::of(priority);
        let BandLimits {
            max_requests,
            max_bytes,
            ..
        } = cfg.limits(class);
        if self.count(class) >= max_requests {
            return Pushed::Refused(Refusal::Full, item);
        }
        if self.bytes(class).saturating_add(bytes) > max_bytes {
            return Pushed::Refused(Refusal::Bytes, item);
        }
        let mut displaced = None;
        let full = self.len() >= cfg.max_requests;
        let heavy = self.total_bytes().saturating_add(bytes) > cfg.max_bytes;
        if full || heavy {
            let why = if full { Refusal::Full } else { Refusal::Bytes };
            // Sheddable requests go first: a request of a higher class takes the place of the
            // newest waiting sheddable one, when that makes room.
            let room = class != Class::Sheddable
                && self.newest_sheddable().is_some_and(|(.., freed)| {
                    self.total_bytes()
                        .saturating_sub(freed)
                        .saturating_add(bytes)
                        <= cfg.max_bytes
                });
            if !room {
                return Pushed::Refused(why, item);
            }
            displaced = self.displace_sheddable();
        }
        let entry = Entry {
            key,
            priority,
            bytes,
            enqueued_ms: now_ms,
            deadline_ms,
            item,
        };
        self.insert(fairness_id, entry);
        Pushed::Queued { displaced }
    }

    fn insert(&mut self, fairness_id: &str, entry: Entry<T>) {
        let class = Class::of(entry.priority);
        add(&mut self.counts, class, 1, true);
        add(&mut self.bytes, class, entry.bytes, true);
        let band = self.bands.entry(entry.priority).or_default();
        match band.flows.iter_mut().find(|f| f.id == fairness_id) {
            Some(f) => f.entries.push_back(entry),
            None => band.flows.push_back(Flow {
                id: fairness_id.to_string(),
                entries: VecDeque::from([entry]),
            }),
        }
    }

    /// The newest entry of the lowest sheddable band: `(priority, flow index, bytes)`.
    fn newest_sheddable(&self) -> Option<(i32, usize, usize)> {
        let (&priority, band) = self.bands.iter().next().filter(|(&p, _)| p < 0)?;
        band.flows
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.entries.back().map(|e| (e.enqueued_ms, i, e.bytes)))
            .max_by_key(|&(t, i, _)| (t, i))
            .map(|(_, i, b)| (priority, i, b))
    }

    /// Takes out the newest entry of the lowest sheddable band.
    fn displace_sheddable(&mut self) -> Option<Entry<T>> {
        let (priority, i, _) = self.newest_sheddable()?;
        let e = self
            .bands
            .get_mut(&priority)?
            .flows
            .get_mut(i)?
            .entries
            .pop_back()?;
        self.after_removal(priority, i, &e);
        Some(e)
    }

    /// Drops an emptied flow and band and lowers the counts after `e` left flow `flow` of band
    /// `priority`.
    fn after_removal(&mut self, priority: i32, flow: usize, e: &Entry<T>) {
        let class = Class::of(e.priority);
        add(&mut self.counts, class, 1, false);
        add(&mut self.bytes, class, e.bytes, false);
        if let Some(band) = self.bands.get_mut(&priority) {
            if band.flows.get(flow).is_some_and(|f| f.entries.is_empty()) {
                band.flows.remove(flow);
            }
            if band.flows.is_empty() {
                self.bands.remove(&priority);
            }
        }
    }

    /// Entries enqueued before this are standing at `now_ms` (0: none can be).
    pub fn standing_before(&self, now_ms: u64) -> u64 {
        crate::config::standing_before(self.newest_first_after_ms, now_ms)
    }

    /// Whether a request of `priority` arriving at `now_ms` goes behind work waiting here: any
    /// of a higher band, or of its own band in a flow still served first come first served
    /// (a standing flow serves its newest first, and an arrival is the newest).
    pub fn goes_before(&self, priority: i32, now_ms: u64) -> bool {
        self.bands.range(priority..).any(|(&p, b)| {
            p > priority
                || b.flows
                    .iter()
                    .any(|f| !f.entries.is_empty() && !self.standing(f.entries.front(), now_ms))
        })
    }

    /// Whether a flow whose oldest entry is `oldest` serves its newest entry first at `now_ms`
    /// (see the module documentation).
    fn standing(&self, oldest: Option<&Entry<T>>, now_ms: u64) -> bool {
        oldest.is_some_and(|e| e.enqueued_ms < self.standing_before(now_ms))
    }

    /// The next entry to dispatch at `now_ms`: the highest band's current flow's oldest entry,
    /// or its newest while that flow is standing.
    pub fn peek(&self, now_ms: u64) -> Option<&Entry<T>> {
        let entries = &self.bands.values().next_back()?.flows.front()?.entries;
        if self.newest_next(now_ms) {
            entries.back()
        } else {
            entries.front()
        }
    }

    /// Whether the next dispatch takes its flow's newest entry (that flow stands).
    fn newest_next(&self, now_ms: u64) -> bool {
        let flow = self
            .bands
            .values()
            .next_back()
            .and_then(|b| b.flows.front());
        flow.is_some_and(|f| self.standing(f.entries.front(), now_ms))
    }

    /// Takes out [`Queue::peek`]'s entry; that flow goes to the back of its band (round robin).
    pub fn pop(&mut self, now_ms: u64) -> Option<Entry<T>> {
        let newest = self.newest_next(now_ms);
        let (&priority, band) = self.bands.iter_mut().next_back()?;
        let mut flow = band.flows.pop_front()?;
        let e = if newest {
            flow.entries.pop_back()
        } else {
            flow.entries.pop_front()
        };
        if !flow.entries.is_empty() {
            band.flows.push_back(flow);
        }
        let class = Class::of(priority);
        if let Some(e) = &e {
            add(&mut self.counts, class, 1, false);
            add(&mut self.bytes, class, e.bytes, false);
        }
        if band.flows.is_empty() {
            self.bands.remove(&priority);
        }
        e
    }

    /// A request taken out with [`Queue::pop`] was dispatched at `now_ms`: the queue's pace
    /// learns from the time since the previous dispatch, when requests waited all along.
    pub fn dispatched(&mut self, now_ms: u64) {
        if let Some(last) = self.last_dispatch_ms {
            let gap = now_ms.saturating_sub(last) as f64;
            self.pace_ms = if self.pace_ms > 0.0 {
                self.pace_ms + PACE_ALPHA * (gap - self.pace_ms)
            } else {
                gap
            };
        }
        self.last_dispatch_ms = (!self.is_empty()).then_some(now_ms);
    }

    /// How long a request of `priority` arriving now would wait before its turn: the requests
    /// of its band and the higher ones, at the queue's pace. `None` while the pace is unknown
    /// (no two dispatches yet in a row of waiting).
    pub fn predicted_wait_ms(&self, priority: i32) -> Option<f64> {
        if self.pace_ms <= 0.0 {
            return None;
        }
        let ahead: usize = self
            .bands
            .range(priority..)
            .map(|(_, b)| b.flows.iter().map(|f| f.entries.len()).sum::<usize>())
            .sum();
        Some(ahead as f64 * self.pace_ms)
    }

    /// Takes out the entry with `key` (its client hung up).
    pub fn remove(&mut self, key: u64) -> Option<Entry<T>> {
        let mut found = None;
        for (&p, band) in &mut self.bands {
            for (i, f) in band.flows.iter_mut().enumerate() {
                if let Some(j) = f.entries.iter().position(|e| e.key == key) {
                    found = Some((p, i, f.entries.remove(j)));
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        let (p, i, e) = found?;
        let e = e?;
        self.after_removal(p, i, &e);
        if self.is_empty() {
            self.last_dispatch_ms = None;
        }
        Some(e)
    }

    /// Takes out every entry that waited longer than its class's time to live at `now_ms`
    /// ([`Refusal::Expired`]) or past its own deadline ([`Refusal::Late`]).
    pub fn expire(&mut self, cfg: &FlowConfig, now_ms: u64) -> Vec<(Entry<T>, Refusal)> {
        let mut out = Vec::new();
        let mut counts = self.counts;
        let mut bytes = self.bytes;
        for (&p, band) in &mut self.bands {
            let class = Class::of(p);
            let ttl = cfg.limits(class).ttl_ms;
            let why = |e: &Entry<T>| {
                if now_ms.saturating_sub(e.enqueued_ms) > ttl {
                    Some(Refusal::Expired)
                } else if e.deadline_ms.is_some_and(|d| now_ms > d) {
                    Some(Refusal::Late)
                } else {
                    None
                }
            };
            for f in &mut band.flows {
                // Deadlines differ between requests, so every entry is looked at (the TTL's
                // expired ones alone would be at the front: FCFS within a flow).
                if !f.entries.iter().any(|e| why(e).is_some()) {
                    continue;
                }
                let mut kept = VecDeque::with_capacity(f.entries.len());
                for e in f.entries.drain(..) {
                    match why(&e) {
                        Some(r) => {
                            add(&mut counts, class, 1, false);
                            add(&mut bytes, class, e.bytes, false);
                            out.push((e, r));
                        }
                        None => kept.push_back(e),
                    }
                }
                f.entries = kept;
            }
            band.flows.retain(|f| !f.entries.is_empty());
        }
        self.bands.retain(|_, b| !b.flows.is_empty());
        self.counts = counts;
        self.bytes = bytes;
        if self.is_empty() {
            self.last_dispatch_ms = None;
        }
        out
    }

    /// The enqueue time of the oldest entry per class (`[sheddable, standard, critical]`).
    pub fn oldest(&self) -> [Option<u64>; 3] {
        let mut out = [None; 3];
        for (&p, band) in &self.bands {
            let oldest = band
                .flows
                .iter()
                .filter_map(|f| f.entries.front().map(|e| e.enqueued_ms))
                .min();
            if let (Some(slot), Some(t)) = (out.get_mut(Class::of(p).index()), oldest) {
                *slot = Some(slot.map_or(t, |s: u64| s.min(t)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
