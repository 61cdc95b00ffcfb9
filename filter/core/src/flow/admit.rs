//! Admission: can some pod of the pool take this request now without passing a saturation
//! bound? Judged per pod on the view the ranking uses (gauges of contradicted pods already
//! replaced by their peers', this proxy's live in-flight and pending work):
//!
//! - **queued prefill work**: the prefill work queued on the pod after admission (its queued
//!   tokens, [`Candidate::queued_tokens`], plus this request's uncached tokens) stays within
//!   `saturation.queue_threshold` mean-sized requests — the bound at which the pool sheds, in
//!   tokens (5 requests of the pool's mean prompt by default). A pod with nothing queued always
//!   takes one request, however large (else a prompt larger than the bound would never go);
//! - **predicted KV use**: the pod's reported KV use plus the KV blocks its pending prefill and
//!   this request will fill (tokens over the pod's KV capacity, `block_size × num_blocks` from
//!   the snapshot) stays within `flow.kv_threshold` (0.95): what is admitted past it is what
//!   the engine preempts (recomputes) later, and what is held below it leaves KV idle (the
//!   default is measured: [`crate::flow::FlowConfig::kv_threshold`]). A pod reporting no KV
//!   gauge or capacity is judged on its queue alone;
//! - a pod put behind the others for a run of server errors takes nothing while others wait.
//!
//! A pod whose engine batches by LoRA adapter slots ([`PodRoom::adapter_slots`]) is judged on
//! its reported KV use alone. Requests waiting there for an adapter slot wait for a slot, not for
//! prefill, and fill no KV until they run; the engine serves the batch's adapters and the base
//! model ahead of them, which the proxy's first-come, first-served queue cannot: holding for the
//! queued-work bound put every request behind them. On real vLLM (`vllm_lora`: 2 pods × 2
//! slots, 8 adapters, 4.5 req/s, seed 42) the filter's TTFT p50 was 10.7 s with both bounds,
//! 1.5 s without the queued-work bound where the engine listed adapters waiting outside its
//! batch, 0.36 s with the pending work also left out of the KV bound there, and 0.24 s without
//! flow control (sglang-router 2.3 s). The engine's own scheduler, which knows the slots,
//! orders that work.
//!
//! With a stale snapshot ([`Mode::LeastInflight`]) nothing waits: the gauges are not known.

use crate::candidate::{Candidate, Features, Mode};
use crate::config::PoolConfig;

/// What admission needs of one pod that the ranking's candidate does not carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodRoom {
    /// KV capacity in tokens (`block_size × num_blocks`; 0 = unknown).
    pub kv_capacity_tokens: u64,
    /// The engine batches by LoRA adapter slots (it reports `max_loras`): its queue may hold
    /// work waiting for a slot, which it orders itself (see the module documentation).
    pub adapter_slots: bool,
}

/// The admission stage's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Some pod can take the request; `fits[i]`: candidate `i` may be picked, its KV bound
    /// kept (queueing on a busy pod is the ranking's trade-off to make: a pod holding the
    /// prompt's prefix may still answer first; passing the KV bound is not, it makes the
    /// engine preempt — recompute — the requests running there).
    Admit(Vec<bool>),
    /// No pod can: the request waits (or, for a sheddable one in a saturated pool, is refused).
    Wait,
    /// Pods have room, but none is predicted to answer within the request's own time-to-first-
    /// token objective: refused now (waiting would not help: the work ahead drains no faster
    /// than the objective runs out).
    Late,
}

/// Whether candidate `c` can take a request of features `f` (see the module documentation).
pub fn has_room(
    pool: &PoolConfig,
    kv_bound: f64,
    c: &Candidate<'_>,
    room: PodRoom,
    f: &Features<'_>,
) -> bool {
    queue_fits(pool, c, room, f) && kv_fits(kv_bound, c, room, f)
}

/// The queued-prefill-work bound of [`has_room`] (none for a pod that batches by adapter
/// slots: see the module documentation).
fn queue_fits(pool: &PoolConfig, c: &Candidate<'_>, room: PodRoom, f: &Features<'_>) -> bool {
    if room.adapter_slots {
        return true;
    }
    let queued = c.queued_tokens(f, Mode::Full);
    let allowed = pool.saturation.queue_threshold * f.mean_prefill_tokens.max(1.0);
    queued <= 0.0 || queued + c.uncached_tokens(f) <= allowed
}

/// The predicted-KV bound of [`has_room`] (a pod with a run of errors fits nothing).
pub fn kv_fits(kv_bound: f64, c: &Candidate<'_>, room: PodRoom, f: &Features<'_>) -> bool {
    if c.ejected {
        return false;
    }
    let queued = c.queued_tokens(f, Mode::Full);
    let uncached = c.uncached_tokens(f);
    match (c.kv_usage, room.kv_capacity_tokens) {
        // Pending work waiting for adapter slots fills no KV until it runs: the gauge alone.
        (Some(kv), cap) if cap > 0 && !room.adapter_slots => {
            let pending = f64::from(c.pending_tokens) + f64::from(c.peer_pending_tokens);
            let added = (pending + uncached) / cap as f64;
            // A pod with nothing of this proxy's queued takes one request however large (else
            // a prompt bigger than the free KV would never go).
            f64::from(kv) + added <= kv_bound || (queued <= 0.0 && f64::from(kv) < kv_bound)
        }
        (Some(kv), _) => f64::from(kv) < kv_bound,
        (None, _) => true,
    }
}

/// Whether candidate `c` is predicted to send the first token within `budget_ms` (the time left
/// of the request's own objective). A pod with nothing queued always is: nothing makes it
/// sooner, and a prompt whose own prefill outlasts the objective would otherwise never go.
pub fn on_time(c: &Candidate<'_>, f: &Features<'_>, budget_ms: f64) -> bool {
    c.queued_tokens(f, Mode::Full) <= 0.0 || c.predicted_ttft_ms(f, Mode::Full) <= budget_ms
}

/// The admission stage: [`Admission::Wait`] when no candidate has room, else which ones may be
/// picked. `rooms[i]` belongs to `cands[i]` (missing = unknown capacity). With `budget_ms` (the
/// time left of the request's own TTFT objective) only pods [`on_time`] may be picked, and a
/// request no pod with room is on time for is [`Admission::Late`].
pub fn admit(
    pool: &PoolConfig,
    kv_threshold: f64,
    cands: &[Candidate<'_>],
    rooms: &[PodRoom],
    f: &Features<'_>,
    mode: Mode,
    budget_ms: Option<f64>,
) -> Admission {
    if mode != Mode::Full {
        return Admission::Admit(vec![true; cands.len()]);
    }
    let room = |i: usize| rooms.get(i).copied().unwrap_or_default();
    let mut fits: Vec<bool> = cands
        .iter()
        .enumerate()
        .map(|(i, c)| kv_fits(kv_threshold, c, room(i), f))
        .collect();
    let has = |i: usize, c: &Candidate<'_>, kv: bool| kv && queue_fits(pool, c, room(i), f);
    let any_room = cands
        .iter()
        .zip(&fits)
        .enumerate()
        .any(|(i, (c, &kv))| has(i, c, kv));
    if !any_room {
        return Admission::Wait;
    }
    if let Some(budget) = budget_ms {
        let timely = cands
            .iter()
            .zip(&fits)
            .enumerate()
            .any(|(i, (c, &kv))| has(i, c, kv) && on_time(c, f, budget));
        if !timely {
            return Admission::Late;
        }
        for (fit, c) in fits.iter_mut().zip(cands) {
            *fit = *fit && on_time(c, f, budget);
        }
    }
    Admission::Admit(fits)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::lora::Placement;
    use crate::predict::Rate;

    fn pool() -> PoolConfig {
        crate::Config::default().default_pool
    }

    fn cand(waiting: u32, kv: f32, pending: u32) -> Candidate<'static> {
        Candidate {
            address: "10.0.0.1:8000",
            stale: false,
            waiting,
            running: 4,
            kv_usage: Some(kv),
            in_flight: 0,
            in_flight_baseline: 0,
            pending_tokens: pending,
            peer_in_flight: 0,
            peer_pending_tokens: 0,
            rate: Rate {
                cost_ms_per_token: 0.2,
                base_ms: 30.0,
            },
            prefix_blocks: 0,
            lora: Placement::default(),
            adapter_ms: 0.0,
            contradicted: false,
            ejected: false,
        }
    }

    const F: Features<'static> = Features {
        adapter: None,
        prompt_tokens: 1000,
        prompt_blocks: 0,
        truncated: false,
        tokens_per_block: 16.0,
        mean_prefill_tokens: 1000.0,
        home: None,
        priority: 0,
        tie: 0,
    };

    const ROOM: PodRoom = PodRoom {
        kv_capacity_tokens: 100_000,
        adapter_slots: false,
    };

    #[test]
    fn a_pod_batching_by_adapter_slots_is_judged_on_its_kv_gauge_alone() {
        let p = pool();
        let slots = PodRoom {
            adapter_slots: true,
            ..ROOM
        };
        // Far past the queued-work bound: held, unless the pod batches by adapter slots.
        let busy = cand(12, 0.3, 9000);
        assert!(!has_room(&p, 0.95, &busy, ROOM, &F));
        assert!(has_room(&p, 0.95, &busy, slots, &F));
        assert_eq!(
            admit(
                &p,
                0.95,
                std::slice::from_ref(&busy),
                &[slots],
                &F,
                Mode::Full,
                None
            ),
            Admission::Admit(vec![true])
        );
        assert_eq!(
            admit(&p, 0.95, &[busy], &[ROOM], &F, Mode::Full, None),
            Admission::Wait
        );
        // The KV gauge still bounds it, without the pending work (which fills no KV yet).
        let pending = cand(0, 0.5, 60_000);
        assert!(!has_room(
            &p,
            0.95,
            &pending,
            PodRoom {
                adapter_slots: false,
                ..slots
            },
            &F
        ));
        assert!(has_room(&p, 0.95, &pending, slots, &F));
        assert!(!has_room(&p, 0.95, &cand(12, 0.96, 9000), slots, &F));
    }

    #[test]
    fn queued_prefill_work_past_the_queue_threshold_waits() {
        let p = pool();
        assert!(has_room(&p, 0.8, &cand(0, 0.1, 0), ROOM, &F));
        // 4 mean requests queued + this one = 5: at the bound, admitted.
        assert!(has_room(&p, 0.8, &cand(0, 0.1, 4000), ROOM, &F));
        assert!(!has_room(&p, 0.8, &cand(0, 0.1, 4001), ROOM, &F));
        // The engine's own waiting count counts the same way (other proxies' work).
        assert!(!has_room(&p, 0.8, &cand(5, 0.1, 0), ROOM, &F));
        // An empty pod takes even a prompt larger than the bound.
        let huge = Features {
            prompt_tokens: 50_000,
            ..F
        };
        assert!(has_room(
            &p,
            0.8,
            &cand(0, 0.0, 0),
            PodRoom::default(),
            &huge
        ));
    }

    #[test]
    fn predicted_kv_use_past_the_kv_threshold_waits() {
        let p = pool();
        // The bound is the one given: at 0.95 the pod that waits at 0.8 takes the request.
        assert!(has_room(&p, 0.95, &cand(0, 0.78, 2000), ROOM, &F));
        assert!(!has_room(&p, 0.95, &cand(0, 0.93, 2000), ROOM, &F));
        // 0.75 + (1000 + 1000) / 100k = 0.77 ≤ 0.8.
        assert!(has_room(&p, 0.8, &cand(0, 0.75, 1000), ROOM, &F));
        // 0.78 + 3000 / 100k = 0.81 > 0.8.
        assert!(!has_room(&p, 0.8, &cand(0, 0.78, 2000), ROOM, &F));
        // Unknown capacity: the reported use alone.
        assert!(has_room(
            &p,
            0.8,
            &cand(0, 0.79, 2000),
            PodRoom::default(),
            &F
        ));
        assert!(!has_room(&p, 0.8, &cand(0, 0.8, 0), PodRoom::default(), &F));
    }

    #[test]
    fn one_pod_with_room_admits_and_only_it() {
        let p = pool();
        let mut ejected = cand(0, 0.0, 0);
        ejected.ejected = true;
        // The pod past the queue bound may still be picked (the ranking weighs its queue);
        // the ejected one may not; one past the KV bound may not either.
        let cands = [cand(9, 0.1, 0), cand(0, 0.1, 0), ejected, cand(0, 0.95, 0)];
        assert_eq!(
            admit(&p, 0.8, &cands, &[ROOM; 4], &F, Mode::Full, None),
            Admission::Admit(vec![true, true, false, false])
        );
        // Only pods past the queue bound: it waits, though their KV has room.
        assert_eq!(
            admit(
                &p,
                0.8,
                &[cand(9, 0.1, 0), cand(7, 0.1, 0)],
                &[ROOM; 2],
                &F,
                Mode::Full,
                None
            ),
            Admission::Wait
        );
        let full = [cand(9, 0.1, 0), cand(0, 0.95, 0)];
        assert_eq!(
            admit(&p, 0.8, &full, &[ROOM; 2], &F, Mode::Full, None),
            Admission::Wait
        );
        // A stale snapshot never holds.
        assert_eq!(
            admit(&p, 0.8, &full, &[ROOM; 2], &F, Mode::LeastInflight, None),
            Admission::Admit(vec![true, true])
        );
    }
    #[test]
    fn a_request_with_its_own_objective_goes_only_where_it_is_predicted_on_time() {
        let p = pool();
        // 30 ms + 0.2 ms per token: 2 waiting requests of 1,000 tokens and this one's 1,000
        // predict 630 ms; 3 waiting, 830 ms; an idle pod 230 ms.
        let (two, three, idle) = (cand(2, 0.1, 0), cand(3, 0.1, 0), cand(0, 0.1, 0));
        let run = |cands: &[Candidate<'static>], budget| {
            admit(&p, 0.95, cands, &[ROOM; 2], &F, Mode::Full, budget)
        };
        let busy = [two.clone(), three];
        assert_eq!(run(&busy, None), Admission::Admit(vec![true, true]));
        assert_eq!(run(&busy, Some(700.0)), Admission::Admit(vec![true, false]));
        // Room on both, neither on time: refused now, not held.
        assert_eq!(run(&busy, Some(500.0)), Admission::Late);
        // A pod with nothing queued is always on time, however short the objective.
        assert_eq!(
            run(&[two, idle], Some(50.0)),
            Admission::Admit(vec![false, true])
        );
        // No room anywhere: it waits (the queue refuses it when its wait would outlast it).
        let full = [cand(9, 0.1, 0), cand(7, 0.1, 0)];
        assert_eq!(run(&full, Some(50.0)), Admission::Wait);
    }
}
