//! A connection's state as TCP names it (what `TCP_INFO` reports).

use super::handle::Stream;
use super::{Core, Fin, Phase};
use crate::sock::addr::ConnState;

impl Core {
    /// The state, from what was taken in so far.
    pub(crate) fn conn_state(&self) -> ConnState {
        let ours = self.fin_out;
        match self.phase {
            Phase::Connecting { .. } => ConnState::Connecting,
            Phase::Failed(_) => ConnState::Closed,
            _ if self.reset => ConnState::Closed,
            _ => match (self.fin_in, ours) {
                (false, Fin::No) => ConnState::Established,
                (false, Fin::Wanted | Fin::Posted) => ConnState::FinWait1,
                (false, Fin::Done) => ConnState::FinWait2,
                (true, Fin::No) => ConnState::CloseWait,
                (true, Fin::Wanted | Fin::Posted) => ConnState::LastAck,
                (true, Fin::Done) => ConnState::Closed,
            },
        }
    }
}

impl Stream {
    /// Where the connection is in its life (what came is taken in
    /// first): a closing side is [`ConnState::FinWait1`] or
    /// [`ConnState::LastAck`] until its FIN is delivered.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// s.shutdown(ulnic::sock::Shutdown::Write)?;
    /// while s.state() == ulnic::sock::ConnState::FinWait1 {
    ///     std::thread::yield_now();
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn state(&self) -> ConnState {
        let mut core = self.core();
        core.poll();
        core.conn_state()
    }
}
