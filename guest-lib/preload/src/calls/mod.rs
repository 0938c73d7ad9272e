//! The interposed functions, by area: `socket` (making, naming,
//! connecting, options), `io` (moving bytes), `splice` (sendfile and
//! splice), `fd` (descriptors), `wait` (poll, select, epoll), `process`
//! (fork, exec).

pub mod fd;
pub mod io;
pub mod process;
pub mod socket;
pub mod splice;
pub mod wait;
