//! `queue`: fewer waiting requests. Absolute, `1 / (1 + waiting)`: an empty queue is worth much
//! more than "the shortest of long queues". Waiting counts are corrected by the requests this
//! proxy sent since the snapshot.

use super::Inputs;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    for (o, c) in out.iter_mut().zip(x.cands) {
        *o = 1.0 / (1.0 + c.est_waiting());
    }
    true
}
