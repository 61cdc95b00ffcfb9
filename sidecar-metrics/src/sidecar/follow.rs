//! A sidecar following hubs: which hub's snapshots it uses, when it falls back to scraping on
//! its own, and which frames it refuses as old.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::clock::now_ms;
use crate::hub::HubEvent;

/// A restarted subscriber takes no frame created more than this before it started: a replay of
/// an older capture is refused (frames come every scrape interval; a restart reconnects within
/// the fallback time).
pub const MAX_FRAME_AGE_MS: u64 = 2_000;

/// A sidecar following hubs: which one it uses, and when it last heard from each.
pub(super) struct Follow {
    events: mpsc::Receiver<HubEvent>,
    /// No hub snapshot for this long: scrape on our own.
    fallback_after: Duration,
    /// The hub whose snapshots are used.
    pub(super) current: Option<usize>,
    /// When each hub last sent a verified frame.
    seen: Vec<Option<Instant>>,
    /// `created_ms` of the last hub snapshot used: an older or equal one (a replay, or a
    /// restarted hub whose clock went back) is never used.
    last_created_ms: u64,
    /// When the current hub's silence becomes a fallback.
    pub(super) deadline: tokio::time::Instant,
}

/// What a hub event means for the loop.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum FollowStep {
    /// Use this snapshot (and stop scraping on our own if we were).
    Use,
    /// Ignore it: a standby hub's (the current one is alive).
    Standby,
    /// Ignore it: not newer than the last one used.
    Old,
    /// Nothing to use any more: scrape on our own now.
    Fallback,
    /// Nothing changes.
    Nothing,
}

impl Follow {
    /// Following `hubs` hubs, whose frames and losses come on `events`: none in use yet, so
    /// scraping on our own starts after `fallback_after` unless one answers.
    pub(super) fn new(
        events: mpsc::Receiver<HubEvent>,
        fallback_after: Duration,
        hubs: usize,
    ) -> Follow {
        Follow {
            events,
            fallback_after,
            current: None,
            seen: vec![None; hubs],
            last_created_ms: now_ms().saturating_sub(MAX_FRAME_AGE_MS),
            deadline: tokio::time::Instant::now() + fallback_after,
        }
    }

    fn fresh(&self, hub: usize, now: Instant) -> bool {
        self.seen
            .get(hub)
            .copied()
            .flatten()
            .is_some_and(|t| now.duration_since(t) < self.fallback_after)
    }

    /// A verified frame from `hub`, created at `created_ms`, at `now_ms` by our clock (a frame
    /// from further in the future than the clocks' skew is refused: it would make every honest
    /// frame after it look old).
    pub(super) fn on_frame(
        &mut self,
        hub: usize,
        created_ms: u64,
        now: Instant,
        now_ms: u64,
    ) -> FollowStep {
        if created_ms > now_ms.saturating_add(llm_router_snapshot::tally::MAX_CLOCK_SKEW_MS) {
            return FollowStep::Old;
        }
        if let Some(slot) = self.seen.get_mut(hub) {
            *slot = Some(now);
        }
        if let Some(c) = self.current {
            if c != hub && self.fresh(c, now) {
                return FollowStep::Standby;
            }
        }
        if created_ms <= self.last_created_ms {
            return FollowStep::Old;
        }
        self.current = Some(hub);
        self.last_created_ms = created_ms;
        self.deadline = tokio::time::Instant::from_std(now + self.fallback_after);
        FollowStep::Use
    }

    /// The connection to `hub` ended. Another hub heard from recently takes over; else fall back.
    pub(super) fn on_down(&mut self, hub: usize, now: Instant) -> FollowStep {
        if let Some(slot) = self.seen.get_mut(hub) {
            *slot = None;
        }
        if self.current != Some(hub) {
            return FollowStep::Nothing;
        }
        let other = (0..self.seen.len()).find(|&h| h != hub && self.fresh(h, now));
        self.current = other;
        match other.and_then(|h| self.seen.get(h).copied().flatten()) {
            Some(t) => {
                self.deadline = tokio::time::Instant::from_std(t + self.fallback_after);
                FollowStep::Nothing
            }
            None => FollowStep::Fallback,
        }
    }
}

pub(super) async fn next_event(f: &mut Option<Follow>) -> Option<HubEvent> {
    match f.as_mut() {
        Some(f) => f.events.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(hubs: usize) -> Follow {
        let (_tx, rx) = mpsc::channel(1);
        Follow {
            events: rx,
            fallback_after: Duration::from_millis(150),
            current: None,
            seen: vec![None; hubs],
            last_created_ms: 0,
            deadline: tokio::time::Instant::now(),
        }
    }

    #[tokio::test]
    async fn one_hub_is_followed_and_its_old_snapshots_are_not() {
        let mut f = follow(1);
        let t0 = Instant::now();
        assert_eq!(f.on_frame(0, 1_000, t0, 2_000), FollowStep::Use);
        assert_eq!(f.current, Some(0));
        // A replay, or a restarted hub whose clock went back: never used.
        assert_eq!(f.on_frame(0, 1_000, t0, 2_000), FollowStep::Old);
        assert_eq!(f.on_frame(0, 999, t0, 2_000), FollowStep::Old);
        assert_eq!(f.on_frame(0, 1_050, t0, 2_000), FollowStep::Use);
        assert_eq!(
            f.deadline,
            tokio::time::Instant::from_std(t0 + Duration::from_millis(150))
        );
        // Its connection ends and no other hub is there: scrape on our own.
        assert_eq!(f.on_down(0, t0), FollowStep::Fallback);
        assert_eq!(f.current, None);
        // Back: its next newer snapshot is used again.
        assert_eq!(f.on_frame(0, 1_100, t0, 2_000), FollowStep::Use);
    }

    #[tokio::test]
    async fn two_hubs_one_in_use_the_other_standing_by() {
        let mut f = follow(2);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(f.on_frame(0, 1_000, t0, 2_000), FollowStep::Use);
        assert_eq!(
            f.on_frame(1, 1_010, t0 + ms(10), 2_000),
            FollowStep::Standby
        );
        assert_eq!(f.on_frame(0, 1_050, t0 + ms(50), 2_000), FollowStep::Use);
        assert_eq!(
            f.on_frame(1, 1_060, t0 + ms(60), 2_000),
            FollowStep::Standby
        );
        // Hub 0's connection ends: hub 1, heard from 10 ms ago, takes over without a fallback.
        assert_eq!(f.on_down(0, t0 + ms(70)), FollowStep::Nothing);
        assert_eq!(f.current, Some(1));
        assert_eq!(
            f.deadline,
            tokio::time::Instant::from_std(t0 + ms(60) + ms(150))
        );
        assert_eq!(f.on_frame(1, 1_110, t0 + ms(110), 2_000), FollowStep::Use);
        // Hub 0 is back, but hub 1 is alive: it stays standby.
        assert_eq!(
            f.on_frame(0, 1_120, t0 + ms(120), 2_000),
            FollowStep::Standby
        );
        // Hub 1 goes silent (no close): after fallback_after, hub 0's frames are used.
        assert_eq!(f.on_frame(0, 1_300, t0 + ms(300), 2_000), FollowStep::Use);
        assert_eq!(f.current, Some(0));
        // A standby's loss changes nothing.
        assert_eq!(f.on_down(1, t0 + ms(310)), FollowStep::Nothing);
        assert_eq!(f.current, Some(0));
        // Losing the last one falls back.
        assert_eq!(f.on_down(0, t0 + ms(320)), FollowStep::Fallback);
    }

    /// A restarted subscriber refuses a frame older than it could have seen (a replay of an old
    /// capture), and any subscriber one from beyond the clocks' skew.
    #[tokio::test]
    async fn a_restarted_subscriber_refuses_old_and_future_frames() {
        let now = 1_700_000_000_000u64;
        let mut f = follow(1);
        f.last_created_ms = now - MAX_FRAME_AGE_MS;
        let t0 = Instant::now();
        assert_eq!(f.on_frame(0, now - 60_000, t0, now), FollowStep::Old);
        assert_eq!(
            f.on_frame(0, now - MAX_FRAME_AGE_MS, t0, now),
            FollowStep::Old
        );
        let skew = llm_router_snapshot::tally::MAX_CLOCK_SKEW_MS;
        assert_eq!(f.on_frame(0, now + skew + 1, t0, now), FollowStep::Old);
        assert_eq!(f.on_frame(0, u64::MAX, t0, now), FollowStep::Old);
        assert_eq!(f.on_frame(0, now - 10, t0, now), FollowStep::Use);
        assert_eq!(f.on_frame(0, now + skew, t0, now), FollowStep::Use);
    }
}
