//! Why a live peer is skipped. nginx's `peer->down` is a word that every stock balancer (round
//! robin, least_conn, hash, ip_hash, random) reads only as "skip this peer when it is not 0", in
//! every worker at once (the peer is in the zone). The live API keeps the reasons in it as bits,
//! so a peer is out of rotation while any reason holds and the balancers need no change:
//! [`CONFIGURED`] is the server's own `down` (the `server ... down;` parameter or the `PUT`
//! field, the only bit `GET` reports as `down`); the others are run-time states kept across a
//! `PUT` that keeps the server.

/// The server's configured `down` (`server ... down;`, `"down": true`).
pub const CONFIGURED: usize = 1;
/// Drained: no new requests, the ones in flight finish (`"drain": true`).
pub const DRAIN: usize = 1 << 1;
/// Failed its health probes (`probe ... fails=N`).
pub const UNHEALTHY: usize = 1 << 2;
/// Not yet passed its first probe under `probe ... mandatory`.
pub const CHECKING: usize = 1 << 3;

/// Ramping up under `probe ... slow_start=`: set in the time slots the server sits out, so it
/// gets a growing share of its weight's traffic (`live::probe::ramp_slot`).
pub const SLOW_START: usize = 1 << 4;

/// The bits a `PUT` sets from the server's fields; the others survive a `PUT`.
pub const SET_BY_PUT: usize = CONFIGURED | DRAIN;

/// The new `down` word of a kept peer: `put` (the bits of [`SET_BY_PUT`] the `PUT` asks for)
/// replaces those bits of `old`, the run-time bits stay.
pub fn merge(old: usize, put: usize) -> usize {
    (old & !SET_BY_PUT) | (put & SET_BY_PUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_replaces_its_own_bits_and_keeps_run_time_ones() {
        assert_eq!(merge(CONFIGURED | UNHEALTHY, 0), UNHEALTHY);
        assert_eq!(merge(CHECKING, CONFIGURED), CONFIGURED | CHECKING);
        assert_eq!(merge(DRAIN | CONFIGURED, DRAIN), DRAIN);
        assert_eq!(merge(0, 0), 0);
    }
}
