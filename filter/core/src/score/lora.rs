//! `lora`: keep each adapter on its home pod. The home (bounded-load rendezvous, see
//! [`crate::lora`]) scores 1; a pod where the adapter is probably loaded anyway 0.6; a pod with a
//! free slot 0.4 (the load costs time but evicts nothing); any other pod 0 (a load that evicts
//! another adapter). So the home wins over "loaded elsewhere" unless its predicted wait grows
//! past what the `ttft` weight trades for 0.4 of this one. A pod whose batch runs `max_loras`
//! other adapters scores 0, home or not: the request would wait there for a slot
//! ([`crate::lora::Placement::blocked`]; the `ttft` scorer prices that wait too). Only for
//! requests naming an adapter.

use super::Inputs;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    if x.req.adapter.is_none() {
        return false;
    }
    for (o, c) in out.iter_mut().zip(x.cands) {
        let p = c.lora;
        *o = if p.blocked {
            0.0
        } else if p.home {
            1.0
        } else if p.resident {
            0.6
        } else if p.free_slot {
            0.4
        } else {
            0.0
        };
    }
    true
}
