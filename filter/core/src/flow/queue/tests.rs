//! The queue's rules, one test each: band order, round robin between fairness ids, first come
//! first served within one, newest first once it stands, time to live, bounds, displacement.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use super::*;

fn cfg() -> FlowConfig {
    FlowConfig::default()
}

/// Pushes `(key, priority, fairness id)` at time `key` with 10 bytes each.
fn queue(cfg: &FlowConfig, items: &[(u64, i32, &str)]) -> Queue<u64> {
    let mut q = Queue::default();
    for &(key, p, id) in items {
        match q.push(cfg, key, p, id, 10, key, key) {
            Pushed::Queued { displaced: None } => {}
            other => panic!("{key} not queued: {other:?}"),
        }
    }
    q
}

/// Pops everything at time 0 (nothing has waited: first come first served within an id).
fn drain(q: &mut Queue<u64>) -> Vec<u64> {
    drain_at(q, 0)
}

fn drain_at(q: &mut Queue<u64>, now_ms: u64) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(head) = q.peek(now_ms).map(|e| e.key) {
        let e = q.pop(now_ms).unwrap();
        assert_eq!(e.key, head, "pop takes what peek showed");
        out.push(e.item);
    }
    assert!(q.is_empty() && q.bands.is_empty());
    out
}

#[test]
fn higher_bands_dispatch_first() {
    let c = cfg();
    let mut q = queue(
        &c,
        &[
            (1, -1, "a"),
            (2, 0, "a"),
            (3, 5, "a"),
            (4, 0, "a"),
            (5, 1, "a"),
            (6, -3, "a"),
        ],
    );
    assert_eq!(drain(&mut q), vec![3, 5, 2, 4, 1, 6]);
}

#[test]
fn fairness_ids_take_turns_within_a_band() {
    let c = cfg();
    // Tenant a floods first; b's one request does not wait behind all of a's.
    let mut q = queue(
        &c,
        &[
            (1, 0, "a"),
            (2, 0, "a"),
            (3, 0, "a"),
            (4, 0, "b"),
            (5, 0, "c"),
            (6, 0, "b"),
        ],
    );
    assert_eq!(drain(&mut q), vec![1, 4, 5, 2, 6, 3]);
}

#[test]
fn one_fairness_id_is_first_come_first_served() {
    let c = cfg();
    let mut q = queue(&c, &[(1, 0, "a"), (2, 0, "a"), (3, 0, "a"), (4, 0, "a")]);
    assert_eq!(drain(&mut q), vec![1, 2, 3, 4]);
}

#[test]
fn entries_past_their_class_ttl_expire() {
    let mut c = cfg();
    c.bands[Class::Sheddable.index()].ttl_ms = 5;
    c.bands[Class::Standard.index()].ttl_ms = 100;
    let mut q = queue(&c, &[(1, -1, "a"), (2, 0, "a"), (3, 0, "b"), (4, -1, "a")]);
    let gone: Vec<u64> = q.expire(&c, 10).into_iter().map(|(e, _)| e.key).collect();
    // Sheddable 1 waited 9 ms > 5; 4 waited 6 ms > 5; standard ones are within 100 ms.
    assert_eq!(gone, vec![1, 4]);
    assert_eq!(q.count(Class::Sheddable), 0);
    assert_eq!(q.bytes(Class::Sheddable), 0);
    assert_eq!(q.len(), 2);
    let gone: Vec<u64> = q.expire(&c, 103).into_iter().map(|(e, _)| e.key).collect();
    assert_eq!(gone, vec![2]);
    assert_eq!(drain(&mut q), vec![3]);
}

#[test]
fn a_class_holds_at_most_max_requests_and_max_bytes() {
    let mut c = cfg();
    c.bands[Class::Standard.index()].max_requests = 2;
    c.bands[Class::Critical.index()].max_bytes = 25;
    let mut q = queue(&c, &[(1, 0, "a"), (2, 0, "b")]);
    assert!(matches!(
        q.push(&c, 3, 0, "c", 10, 3, 3),
        Pushed::Refused(Refusal::Full, 3)
    ));
    // Another class is not held by the standard bound.
    assert!(matches!(
        q.push(&c, 4, 1, "a", 10, 4, 4),
        Pushed::Queued { .. }
    ));
    assert!(matches!(
        q.push(&c, 5, 2, "a", 10, 5, 5),
        Pushed::Queued { .. }
    ));
    // 20 bytes held, 10 more would pass 25.
    assert!(matches!(
        q.push(&c, 6, 1, "a", 10, 6, 6),
        Pushed::Refused(Refusal::Bytes, 6)
    ));
    assert_eq!(q.bytes(Class::Critical), 20);
    assert_eq!(Refusal::Full.reason(), "rejected-queue-full");
    assert_eq!(Refusal::Bytes.reason(), "rejected-queue-bytes");
}

#[test]
fn a_full_queue_sheds_waiting_sheddable_requests_first() {
    let mut c = cfg();
    c.max_requests = 3;
    let mut q = queue(&c, &[(1, -1, "a"), (2, -1, "b"), (3, 0, "a")]);
    // A sheddable arrival is refused.
    assert!(matches!(
        q.push(&c, 4, -1, "c", 10, 4, 4),
        Pushed::Refused(Refusal::Full, 4)
    ));
    // A critical one displaces the newest sheddable (2), not the oldest.
    match q.push(&c, 5, 1, "a", 10, 5, 5) {
        Pushed::Queued {
            displaced: Some(d), ..
        } => assert_eq!(d.key, 2),
        other => panic!("{other:?}"),
    }
    // A standard one displaces the last sheddable.
    match q.push(&c, 6, 0, "b", 10, 6, 6) {
        Pushed::Queued {
            displaced: Some(d), ..
        } => assert_eq!(d.key, 1),
        other => panic!("{other:?}"),
    }
    // Nothing sheddable left: refused.
    assert!(matches!(
        q.push(&c, 7, 1, "a", 10, 7, 7),
        Pushed::Refused(Refusal::Full, 7)
    ));
    assert_eq!(drain(&mut q), vec![5, 3, 6]);
}

#[test]
fn displacement_needs_to_make_room_for_the_bytes() {
    let mut c = cfg();
    c.max_bytes = 30;
    let mut q = queue(&c, &[(1, -1, "a"), (2, 0, "a"), (3, 0, "a")]);
    // 30 held; a 25-byte critical request would need more than the one sheddable frees.
    assert!(matches!(
        q.push(&c, 4, 1, "a", 25, 4, 4),
        Pushed::Refused(Refusal::Bytes, 4)
    ));
    assert_eq!(q.len(), 3, "nothing was displaced for nothing");
    match q.push(&c, 5, 1, "a", 10, 5, 5) {
        Pushed::Queued { displaced: Some(d) } => assert_eq!(d.key, 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_removed_entry_leaves_nothing_behind() {
    let c = cfg();
    let mut q = queue(&c, &[(1, 0, "a"), (2, 3, "b"), (3, 0, "a")]);
    assert_eq!(q.remove(2).map(|e| e.item), Some(2));
    assert_eq!(q.remove(2), None);
    assert_eq!(q.count(Class::Critical), 0);
    assert_eq!(q.oldest(), [None, Some(1), None]);
    assert_eq!(q.remove(1).map(|e| e.item), Some(1));
    assert_eq!(q.remove(3).map(|e| e.item), Some(3));
    assert!(q.is_empty() && q.bands.is_empty());
    assert_eq!(q.oldest(), [None; 3]);
}

#[test]
fn a_request_held_past_its_own_deadline_is_refused_then() {
    let c = cfg();
    let mut q: Queue<u64> = Queue::default();
    // Three standard requests of one tenant; the middle one must start within 50 ms.
    for (key, deadline) in [(1, None), (2, Some(50)), (3, None)] {
        assert!(matches!(
            q.push_until(&c, key, 0, "a", 10, 0, deadline, key),
            Pushed::Queued { displaced: None }
        ));
    }
    assert!(q.expire(&c, 50).is_empty(), "not before its deadline");
    let gone: Vec<(u64, Refusal)> = q
        .expire(&c, 51)
        .into_iter()
        .map(|(e, r)| (e.key, r))
        .collect();
    assert_eq!(
        gone,
        vec![(2, Refusal::Late)],
        "behind a request without one"
    );
    assert_eq!(drain(&mut q), vec![1, 3]);
    // Past the TTL the class's reason wins.
    q.push_until(&c, 4, 0, "a", 10, 0, Some(10_000_000), 4);
    let gone = q.expire(&c, c.limits(Class::Standard).ttl_ms + 1);
    assert_eq!(gone[0].1, Refusal::Expired);
}

#[test]
fn a_request_that_would_wait_past_its_deadline_is_refused_at_once() {
    let c = cfg();
    let mut q: Queue<u64> = Queue::default();
    // Ten wait; the queue dispatches one every 100 ms.
    for key in 0..10u64 {
        q.push(&c, key, 0, "a", 10, 0, key);
    }
    assert_eq!(
        q.predicted_wait_ms(0),
        None,
        "no pace yet: nothing refused on a guess"
    );
    for t in [100, 200, 300] {
        q.pop(t).unwrap();
        q.dispatched(t);
    }
    // Seven wait ahead: about 700 ms.
    let wait = q.predicted_wait_ms(0).unwrap();
    assert!((600.0..=800.0).contains(&wait), "{wait}");
    match q.push_until(&c, 20, 0, "b", 10, 300, Some(300 + 500), 20) {
        Pushed::Refused(Refusal::Late, 20) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        q.push_until(&c, 21, 0, "b", 10, 300, Some(300 + 1_000), 21),
        Pushed::Queued { .. }
    ));
    // A critical request has nobody ahead of it.
    assert!(matches!(
        q.push_until(&c, 22, 1, "b", 10, 300, Some(300 + 50), 22),
        Pushed::Queued { .. }
    ));
    // A deadline already past is refused whatever the queue.
    let mut empty: Queue<u64> = Queue::default();
    assert!(matches!(
        empty.push_until(&c, 1, 0, "a", 10, 300, Some(300), 1),
        Pushed::Refused(Refusal::Late, 1)
    ));
    // Once the queue has emptied, the gap to the next dispatch is not a pace.
    drain(&mut q);
    q.dispatched(400);
    q.push(&c, 30, 0, "a", 10, 10_000, 30);
    q.push(&c, 31, 0, "a", 10, 10_000, 31);
    q.pop(10_000);
    q.dispatched(10_000);
    let after = q.predicted_wait_ms(0).unwrap();
    assert!(after <= 200.0, "one ahead at the old pace: {after}");
}

#[test]
fn an_id_whose_oldest_waited_past_the_bound_serves_its_newest_first() {
    let c = FlowConfig {
        newest_first_after_ms: 1_000,
        ..cfg()
    };
    // Tenant "a" queued at t = 1..=4; "b" at t = 1,500.
    let q = queue(&c, &[(1, 0, "a"), (2, 0, "a"), (3, 0, "a"), (4, 0, "a")]);
    // Within the bound: first come first served.
    assert_eq!(drain_at(&mut q.clone(), 1_000), vec![1, 2, 3, 4]);
    // Past it (the oldest waited 1,001 ms): the newest first, until the oldest has gone.
    assert_eq!(drain_at(&mut q.clone(), 1_002), vec![4, 3, 2, 1]);
    // Per id: "b"'s fresh request keeps its turn in the round robin, and "a" serves newest
    // first while its own oldest is standing.
    let mut q = q;
    assert!(matches!(
        q.push(&c, 1_500, 0, "b", 10, 1_500, 1_500),
        Pushed::Queued { .. }
    ));
    assert_eq!(drain_at(&mut q, 1_600), vec![4, 1_500, 3, 2, 1]);
    // A band above still goes first, whatever stands below it.
    let mut q = queue(&c, &[(1, 0, "a"), (2, 0, "a"), (3, 1, "a")]);
    assert_eq!(drain_at(&mut q, 5_000), vec![3, 2, 1]);
    // Off (0): always first come first served.
    let off = FlowConfig {
        newest_first_after_ms: 0,
        ..cfg()
    };
    let mut q = queue(&off, &[(1, 0, "a"), (2, 0, "a"), (3, 0, "a")]);
    assert_eq!(drain_at(&mut q, 1_000_000), vec![1, 2, 3]);
}

#[test]
fn an_arrival_goes_behind_only_work_that_is_served_before_it() {
    let c = FlowConfig {
        newest_first_after_ms: 1_000,
        ..cfg()
    };
    let q = queue(&c, &[(10, 0, "a"), (20, 0, "a")]);
    // A fresh queue: a new standard request queues behind it; a critical one does not.
    assert!(q.goes_before(0, 500));
    assert!(!q.goes_before(1, 500));
    // Standing (the oldest waited past the bound): a new request is its newest, served first.
    assert!(!q.goes_before(0, 1_500));
    // A sheddable arrival is behind standard work, standing or not.
    assert!(q.goes_before(-1, 1_500));
    // Nothing stands with the order off.
    let off = FlowConfig {
        newest_first_after_ms: 0,
        ..cfg()
    };
    assert!(queue(&off, &[(10, 0, "a")]).goes_before(0, 1_000_000));
    assert_eq!(q.standing_before(1_500), 500);
    assert_eq!(queue(&off, &[(10, 0, "a")]).standing_before(1_500), 0);
}
