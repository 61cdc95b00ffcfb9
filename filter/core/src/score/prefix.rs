//! `prefix`: the fraction of the prompt's blocks the pod probably has cached (GAIE's prefix
//! scorer). The prefill this saves is also counted, in time, by `ttft`; this scorer adds a
//! pull towards cache locality that does not depend on queue state.

use super::Inputs;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    if x.req.prompt_blocks == 0 {
        return false;
    }
    let total = f64::from(x.req.prompt_blocks);
    for (o, c) in out.iter_mut().zip(x.cands) {
        *o = f64::from(c.prefix_blocks) / total;
    }
    true
}
