//! The fabric between ports (spec §10): its shape (`topology`) and the
//! routes through it (`routing`). Links, packets and the transport that
//! will carry messages along these routes come next (issue 11); today the
//! switch still copies between ports directly.

pub mod routing;
pub mod topology;
