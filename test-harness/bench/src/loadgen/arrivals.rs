//! Open-loop arrival processes: when each request is sent, decided before the run starts.
//!
//! Arrival times come from a seeded generator so every router sees exactly the same sequence.
//! Nothing here waits on responses: the load generator fires each request at its time whatever
//! happened to the previous ones (an open loop, as real clients behave).

use rand::Rng;
use serde::Serialize;
use std::time::Duration;

/// How requests arrive over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrival {
    /// Exponential gaps with a constant mean rate (requests per second).
    Poisson {
        /// Mean requests per second; must be > 0.
        rate: f64,
    },
    /// Alternating phases, each a Poisson process of its own rate: `on_s` seconds at `on_rate`,
    /// then `off_s` seconds at `off_rate`, repeated (the run starts with an "on" phase).
    Bursty {
        /// Rate during a burst (requests per second).
        on_rate: f64,
        /// Rate between bursts (may be 0).
        off_rate: f64,
        /// Length of a burst, seconds (> 0).
        on_s: f64,
        /// Length of a quiet phase, seconds (>= 0).
        off_s: f64,
    },
}

impl Arrival {
    /// The long-run mean rate, requests per second.
    pub fn mean_rate(&self) -> f64 {
        match *self {
            Arrival::Poisson { rate } => rate,
            Arrival::Bursty {
                on_rate,
                off_rate,
                on_s,
                off_s,
            } => {
                let period = on_s + off_s;
                if period <= 0.0 {
                    0.0
                } else {
                    (on_rate * on_s + off_rate * off_s) / period
                }
            }
        }
    }

    /// The rate in force at time `t` seconds after the start, and when that phase ends.
    fn phase_at(&self, t: f64) -> (f64, f64) {
        match *self {
            Arrival::Poisson { rate } => (rate, f64::INFINITY),
            Arrival::Bursty {
                on_rate,
                off_rate,
                on_s,
                off_s,
            } => {
                let period = on_s + off_s;
                if period <= 0.0 {
                    return (0.0, f64::INFINITY);
                }
                // Phase ends are computed the same way every time and the phase returned always
                // ends after `t`, so a caller that jumps to a phase end always moves on (floating
                // point `t / period` may land just below a boundary).
                let mut cycle = (t / period).floor();
                loop {
                    let on_end = cycle * period + on_s;
                    let off_end = (cycle + 1.0) * period;
                    if t < on_end {
                        return (on_rate, on_end);
                    }
                    if t < off_end {
                        return (off_rate, off_end);
                    }
                    cycle += 1.0;
                }
            }
        }
    }

    /// Arrival offsets from the start, sorted, at most `max` of them and all before `horizon`.
    ///
    /// A phase change restarts the exponential clock at the boundary, which is exact for a
    /// piecewise-constant Poisson process (the exponential is memoryless).
    pub fn times<R: Rng>(&self, rng: &mut R, horizon: Duration, max: usize) -> Vec<Duration> {
        let horizon = horizon.as_secs_f64();
        let mut out = Vec::new();
        let mut t = 0.0_f64;
        while out.len() < max && t < horizon {
            let (rate, phase_end) = self.phase_at(t);
            if rate <= 0.0 || !rate.is_finite() {
                if !phase_end.is_finite() {
                    break;
                }
                t = phase_end;
                continue;
            }
            // Inverse-CDF sample of Exp(rate); 1 - u is in (0, 1] so ln never sees 0.
            let u: f64 = rng.random::<f64>();
            let gap = -(1.0 - u).ln() / rate;
            if t + gap >= phase_end {
                t = phase_end;
                continue;
            }
            t += gap;
            if t < horizon {
                out.push(Duration::from_secs_f64(t));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn poisson_mean_rate_is_close_to_the_asked_rate() {
        let a = Arrival::Poisson { rate: 20.0 };
        let mut rng = StdRng::seed_from_u64(7);
        let t = a.times(&mut rng, Duration::from_secs(500), usize::MAX);
        let rate = t.len() as f64 / 500.0;
        // 10,000 expected; sd = 100, so ±5% is 5 sd.
        assert!((rate - 20.0).abs() < 1.0, "rate {rate}");
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn poisson_gaps_have_exponential_spread() {
        // The coefficient of variation of exponential gaps is 1 (a fixed-interval generator
        // would give 0).
        let a = Arrival::Poisson { rate: 10.0 };
        let mut rng = StdRng::seed_from_u64(11);
        let t = a.times(&mut rng, Duration::from_secs(1000), usize::MAX);
        let gaps: Vec<f64> = t.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.1, "cv {cv}");
    }

    #[test]
    fn bursty_mean_rate_and_phase_rates() {
        let a = Arrival::Bursty {
            on_rate: 40.0,
            off_rate: 2.0,
            on_s: 5.0,
            off_s: 15.0,
        };
        assert!((a.mean_rate() - 11.5).abs() < 1e-9);
        let mut rng = StdRng::seed_from_u64(3);
        let t = a.times(&mut rng, Duration::from_secs(2000), usize::MAX);
        let rate = t.len() as f64 / 2000.0;
        assert!((rate - 11.5).abs() < 0.6, "rate {rate}");
        let on = t.iter().filter(|d| d.as_secs_f64() % 20.0 < 5.0).count() as f64;
        let off = t.len() as f64 - on;
        let on_rate = on / (2000.0 / 20.0 * 5.0);
        let off_rate = off / (2000.0 / 20.0 * 15.0);
        assert!((on_rate - 40.0).abs() < 2.5, "on {on_rate}");
        assert!((off_rate - 2.0).abs() < 0.5, "off {off_rate}");
    }

    #[test]
    fn bounded_by_count_and_horizon() {
        let a = Arrival::Poisson { rate: 100.0 };
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(a.times(&mut rng, Duration::from_secs(100), 50).len(), 50);
        let t = a.times(&mut rng, Duration::from_secs(1), usize::MAX);
        assert!(t.iter().all(|d| *d < Duration::from_secs(1)));
    }

    #[test]
    fn phase_lengths_that_floats_cannot_represent_still_end() {
        // 10/3 and 20/3 s phases (a 3x speed-up of 10 s / 20 s): jumping to a phase end must
        // always move on.
        let a = Arrival::Bursty {
            on_rate: 30.0,
            off_rate: 3.0,
            on_s: 10.0 / 3.0,
            off_s: 20.0 / 3.0,
        };
        let t = a.times(
            &mut StdRng::seed_from_u64(2),
            Duration::from_secs(400),
            100_000,
        );
        let rate = t.len() as f64 / 400.0;
        assert!((rate - a.mean_rate()).abs() < 0.1 * a.mean_rate(), "{rate}");
        let z = Arrival::Bursty {
            on_rate: 5.0,
            off_rate: 0.0,
            on_s: 0.1,
            off_s: 0.0,
        };
        assert!(!z
            .times(
                &mut StdRng::seed_from_u64(2),
                Duration::from_secs(50),
                10_000
            )
            .is_empty());
    }

    #[test]
    fn same_seed_same_times() {
        let a = Arrival::Bursty {
            on_rate: 10.0,
            off_rate: 0.0,
            on_s: 1.0,
            off_s: 1.0,
        };
        let x = a.times(&mut StdRng::seed_from_u64(5), Duration::from_secs(30), 1000);
        let y = a.times(&mut StdRng::seed_from_u64(5), Duration::from_secs(30), 1000);
        assert_eq!(x, y);
        assert!(x.iter().all(|d| d.as_secs_f64() % 2.0 < 1.0));
    }
}
