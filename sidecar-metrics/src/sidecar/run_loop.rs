//! The scrape loop itself ([`run_loop`]): one `select!` over the scrapes coming back, the push's
//! answer, a queued snapshot coming due, hub frames and losses, tally frames (mode hub) and the
//! next round, each handled by a [`Driver`] method.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::sync::watch;

use super::follow::{next_event, Follow, FollowStep};
use super::{BoxFut, Done, Loop};
use crate::clock::now_ms;
use crate::hub::HubEvent;
use crate::push::PushOutcome;
use crate::share::TallyBoard;

/// Resolves when the board (if any) changed; never without one.
async fn board_changed(board: &Option<Arc<TallyBoard>>) {
    match board {
        Some(b) => b.changed().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; never when `None`.
async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

async fn poll_opt<F: Future + Unpin>(f: &mut Option<F>) -> F::Output {
    match f.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// The scrape loop: rounds of scrapes (or, following hubs, their snapshots), pushes and their
/// answers, hub frames, and (mode hub) tally frames, until `shutdown`.
pub(super) async fn run_loop(
    lp: Loop,
    follow: Option<Follow>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut d = Driver::new(lp, follow);
    let far = || tokio::time::Instant::now() + Duration::from_secs(86_400);
    loop {
        let hub_deadline = d
            .follow
            .as_ref()
            .filter(|_| !d.scraping)
            .map_or_else(far, |f| f.deadline);
        let mut fall_back = None;
        let queued_due = d.lp.queued_due(d.push_fut.is_some());
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(first) = d.inflight.next(), if !d.inflight.is_empty() => {
                d.scrapes_back(first).await;
            }
            outcome = poll_opt(&mut d.push_fut) => {
                d.push_fut = None;
                d.lp.push_answered(outcome);
            }
            _ = sleep_opt(queued_due) => {
                if let Some((snap, trim, peer_only)) = d.lp.queued.take() {
                    d.lp.deliver(snap, trim, now_ms(), peer_only, &mut d.push_fut);
                }
            }
            _ = board_changed(&d.board), if d.tally_frame_due.is_none() => {
                let now = tokio::time::Instant::now();
                d.tally_frame_due =
                    Some(d.lp.published_at.map_or(now, |t| (t + d.tally_gap).max(now)));
            }
            _ = sleep_opt(d.tally_frame_due) => {
                d.tally_frame_due = None;
                d.lp.republish();
            }
            Some(ev) = next_event(&mut d.follow) => fall_back = d.hub_event(ev),
            _ = tokio::time::sleep_until(hub_deadline), if d.follow.is_some() && !d.scraping => {
                if let Some(f) = d.follow.as_mut() {
                    f.current = None;
                }
                fall_back = Some("silent");
            }
            _ = tokio::time::sleep_until(d.next_round), if d.scraping => d.next_round_due(),
        }
        if let Some(reason) = fall_back {
            d.scraping = true;
            d.next_round = tokio::time::Instant::now();
            d.lp.stats.hub_source("scrape", Some(reason));
            tracing::warn!(reason, "no hub answers; scraping on our own until one does");
        }
    }
    // Let a push in flight finish (bounded by its timeout) so the last state is not lost.
    if let Some(f) = d.push_fut {
        let o = f.await;
        d.lp.push_answered(o);
    }
    tracing::info!("scrape loop stopped");
}

/// What [`run_loop`] tracks besides [`Loop`]: the scrapes and the push in flight, the round
/// being collected, whether it scrapes on its own or follows hubs, and (mode hub) when the next
/// tally frame is due.
struct Driver {
    lp: Loop,
    follow: Option<Follow>,
    inflight: FuturesUnordered<BoxFut<Done>>,
    push_fut: Option<BoxFut<PushOutcome>>,
    round: u64,
    /// Scrapes of the open round not back yet.
    pending: usize,
    round_open: bool,
    next_round: tokio::time::Instant,
    coalesce: Duration,
    /// Following hubs: no scraping of our own until they stay silent.
    scraping: bool,
    /// Mode hub: a changed tally schedules a frame, at most one per `tally_frame_ms` after the
    /// last frame of any kind.
    board: Option<Arc<TallyBoard>>,
    tally_gap: Duration,
    tally_frame_due: Option<tokio::time::Instant>,
}

impl Driver {
    fn new(lp: Loop, follow: Option<Follow>) -> Driver {
        Driver {
            inflight: FuturesUnordered::new(),
            push_fut: None,
            round: 0,
            pending: 0,
            round_open: false,
            next_round: tokio::time::Instant::now(),
            coalesce: Duration::from_millis(lp.cfg.scrape.coalesce_ms),
            scraping: follow.is_none(),
            board: lp.tally_board(),
            tally_gap: Duration::from_millis(lp.cfg.hub.tally_frame_ms),
            tally_frame_due: None,
            lp,
            follow,
        }
    }

    /// Scrapes came back, `first` among them. Take every answer that is already there, then, if
    /// the round still waits for some, pause briefly so the rest arrive together: one wake-up
    /// per batch instead of one per pod (context switches were the largest cost in the profile).
    async fn scrapes_back(&mut self, first: Done) {
        let mut next = Some(first);
        while let Some(done) = next {
            let this_round = done.round == self.round;
            self.lp.apply(done);
            if this_round && self.round_open {
                self.pending = self.pending.saturating_sub(1);
                if self.pending == 0 {
                    self.round_open = false;
                    self.lp.finish_round(&mut self.push_fut);
                }
            }
            next = self.inflight.next().now_or_never().flatten();
        }
        if self.round_open && !self.inflight.is_empty() && !self.coalesce.is_zero() {
            tokio::time::sleep(self.coalesce).await;
        }
    }

    /// The next round is due: the open one ends as it is, the next one starts.
    fn next_round_due(&mut self) {
        if self.round_open {
            self.round_open = false;
            self.lp.finish_round(&mut self.push_fut);
        }
        self.round += 1;
        self.pending = self.lp.start_round(self.round, &mut self.inflight);
        let now = tokio::time::Instant::now();
        self.next_round += self.lp.jittered();
        if self.next_round < now {
            self.next_round = now + self.lp.jittered();
        }
        if self.pending == 0 {
            self.lp.finish_round(&mut self.push_fut);
        } else {
            self.round_open = true;
        }
    }

    /// A hub's frame or loss; the reason to scrape on our own from now on, if it is one.
    fn hub_event(&mut self, ev: HubEvent) -> Option<&'static str> {
        let f = self.follow.as_mut()?;
        let now = Instant::now();
        match ev {
            HubEvent::Frame {
                hub,
                snapshot,
                tallies,
            } => match f.on_frame(hub, snapshot.created_ms, now, now_ms()) {
                FollowStep::Use => {
                    if self.scraping {
                        self.scraping = false;
                        // Scrapes still in flight finish and are applied to the pods' state,
                        // without closing a round.
                        self.round_open = false;
                        self.lp.stats.hub_source("hub", None);
                        tracing::info!(hub, "using the hub's snapshots; not scraping on our own");
                    }
                    self.lp.offer_hub(snapshot, &tallies, &mut self.push_fut);
                }
                FollowStep::Old => self.lp.stats.hub_frame_refused("old"),
                _ => {}
            },
            HubEvent::Down { hub, reason } => {
                if f.on_down(hub, now) == FollowStep::Fallback && !self.scraping {
                    tracing::debug!(hub, reason = %reason, "the hub in use is gone");
                    return Some("closed");
                }
            }
        }
        None
    }
}
