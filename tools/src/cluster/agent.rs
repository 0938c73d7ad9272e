//! The guest agent (`ulnic agent`, started by the guest's init when the
//! launcher asks for it) and the frames it exchanges with the host over a
//! virtio-serial port named `ulnic.agent`.
//!
//! Frames: `u16 magic, u8 kind, u8 0, u32 stream id, u32 length`, then the
//! data; little endian. The host starts streams (a command, a file copy);
//! the guest answers on the same id. Several streams run at once.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// Marks the start of a frame.
pub const MAGIC: u16 = 0x4c55;
/// Largest frame payload.
pub const MAX_FRAME: usize = 1 << 20;
/// The virtio-serial port's name.
pub const PORT_NAME: &str = "ulnic.agent";

/// Frame kinds.
pub mod kind {
    /// Host: run `sh -c DATA`.
    pub const EXEC: u8 = 1;
    /// Host: start writing a file; DATA = u32 mode, then the path.
    pub const PUT_BEGIN: u8 = 2;
    /// Host: file bytes.
    pub const PUT_DATA: u8 = 3;
    /// Host: the file is complete.
    pub const PUT_END: u8 = 4;
    /// Host: send signal `i32 DATA` to the stream's process group.
    pub const KILL: u8 = 5;
    /// Guest: the agent started; DATA = kernel release.
    pub const READY: u8 = 16;
    /// Guest: standard output bytes.
    pub const STDOUT: u8 = 17;
    /// Guest: standard error bytes.
    pub const STDERR: u8 = 18;
    /// Guest: the stream ended; DATA = i32 exit status (128 + signal when
    /// killed).
    pub const EXIT: u8 = 19;
    /// Guest or host: the stream failed; DATA = the reason.
    pub const ERROR: u8 = 20;
    /// Host supervisor to its clients: a JSON document.
    pub const INFO: u8 = 21;
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// `kind::*`.
    pub kind: u8,
    /// Stream id.
    pub id: u32,
    /// Payload.
    pub data: Vec<u8>,
}

impl Frame {
    /// A frame.
    pub fn new(kind: u8, id: u32, data: impl Into<Vec<u8>>) -> Self {
        Frame {
            kind,
            id,
            data: data.into(),
        }
    }

    /// An EXIT frame with `code`.
    pub fn exit(id: u32, code: i32) -> Self {
        Frame::new(kind::EXIT, id, code.to_le_bytes())
    }

    /// The exit status of an EXIT frame.
    pub fn exit_code(&self) -> i32 {
        self.data
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map_or(-1, i32::from_le_bytes)
    }
}

/// Writes one frame (header and data in one write, so frames from several
/// threads never interleave when the writer is shared under a lock).
pub fn write_frame(w: &mut impl Write, f: &Frame) -> io::Result<()> {
    if f.data.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "frame too long",
        ));
    }
    let mut b = Vec::with_capacity(12 + f.data.len());
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&[f.kind, 0]);
    b.extend_from_slice(&f.id.to_le_bytes());
    b.extend_from_slice(&(f.data.len() as u32).to_le_bytes());
    b.extend_from_slice(&f.data);
    w.write_all(&b)?;
    w.flush()
}

/// Reads one frame; skips bytes until a frame start (a peer that restarted
/// mid-frame leaves garbage). EOF gives `UnexpectedEof`.
pub fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut h = [0u8; 12];
    r.read_exact(&mut h[..2])?;
    while u16::from_le_bytes([h[0], h[1]]) != MAGIC {
        h[0] = h[1];
        r.read_exact(&mut h[1..2])?;
    }
    r.read_exact(&mut h[2..])?;
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes"),
        ));
    }
    let mut data = vec![0u8; len];
    r.read_exact(&mut data)?;
    Ok(Frame {
        kind: h[2],
        id: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
        data,
    })
}

/// The device node of the virtio-serial port named `ulnic.agent`.
pub fn find_port() -> Option<PathBuf> {
    let entries = std::fs::read_dir("/sys/class/virtio-ports").ok()?;
    entries.flatten().find_map(|e| {
        let name = std::fs::read_to_string(e.path().join("name")).ok()?;
        (name.trim() == PORT_NAME).then(|| Path::new("/dev").join(e.file_name()))
    })
}

type Writer = Arc<Mutex<File>>;

fn send(w: &Writer, f: &Frame) {
    let mut g = w.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = write_frame(&mut *g, f) {
        eprintln!("ulnic agent: cannot write to the host: {e}");
    }
}

/// Runs the agent on `port` until the port fails.
pub fn run(port: &Path) -> anyhow::Result<()> {
    let mut input = File::options()
        .read(true)
        .write(true)
        .open(port)
        .map_err(|e| anyhow::anyhow!("{}: {e}", port.display()))?;
    let out: Writer = Arc::new(Mutex::new(input.try_clone()?));
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    send(&out, &Frame::new(kind::READY, 0, release.trim()));
    eprintln!("ulnic-guest: agent ready on {}", port.display());
    let groups: Arc<Mutex<HashMap<u32, i32>>> = Arc::default();
    let mut files: HashMap<u32, (File, PathBuf, u32)> = HashMap::new();
    loop {
        let f = match read_frame(&mut input) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                // No host connected: wait for one.
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            Err(e) => return Err(anyhow::anyhow!("reading the host channel: {e}")),
        };
        match f.kind {
            kind::EXEC => exec(&out, &groups, f.id, &String::from_utf8_lossy(&f.data)),
            kind::KILL => {
                let sig = f.exit_code();
                if let Some(&pgid) = groups.lock().unwrap_or_else(|p| p.into_inner()).get(&f.id) {
                    // SAFETY: kill(2) on a process group this agent started;
                    // no memory is involved.
                    unsafe { libc::kill(-pgid, sig) };
                }
            }
            kind::PUT_BEGIN if f.data.len() > 4 => {
                let mode = u32::from_le_bytes([f.data[0], f.data[1], f.data[2], f.data[3]]);
                let path = PathBuf::from(String::from_utf8_lossy(&f.data[4..]).into_owned());
                if let Some(parent) = path.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                match File::create(&path) {
                    Ok(file) => {
                        files.insert(f.id, (file, path, mode));
                    }
                    Err(e) => send(
                        &out,
                        &Frame::new(kind::ERROR, f.id, format!("{}: {e}", path.display())),
                    ),
                }
            }
            kind::PUT_DATA => {
                if let Some((file, path, _)) = files.get_mut(&f.id) {
                    if let Err(e) = file.write_all(&f.data) {
                        let msg = format!("{}: {e}", path.display());
                        files.remove(&f.id);
                        send(&out, &Frame::new(kind::ERROR, f.id, msg));
                    }
                }
            }
            kind::PUT_END => {
                if let Some((file, path, mode)) = files.remove(&f.id) {
                    let r = file
                        .sync_all()
                        .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(mode)));
                    send(
                        &out,
                        &match r {
                            Ok(()) => Frame::exit(f.id, 0),
                            Err(e) => {
                                Frame::new(kind::ERROR, f.id, format!("{}: {e}", path.display()))
                            }
                        },
                    );
                }
            }
            other => send(
                &out,
                &Frame::new(kind::ERROR, f.id, format!("unknown request kind {other}")),
            ),
        }
    }
}

/// Starts `sh -c command` in its own process group and streams its output
/// and exit status back on stream `id`.
fn exec(out: &Writer, groups: &Arc<Mutex<HashMap<u32, i32>>>, id: u32, command: &str) {
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            send(
                out,
                &Frame::new(kind::ERROR, id, format!("cannot start sh: {e}")),
            );
            return;
        }
    };
    groups
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, child.id() as i32);
    let pumps: Vec<_> = [
        (
            kind::STDOUT,
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
        (kind::STDERR, child.stderr.take().map(|s| Box::new(s) as _)),
    ]
    .into_iter()
    .filter_map(|(k, s)| s.map(|s| (k, s)))
    .map(|(k, mut s)| {
        let out = out.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16384];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                send(&out, &Frame::new(k, id, &buf[..n]));
            }
        })
    })
    .collect();
    let out = out.clone();
    let groups = groups.clone();
    std::thread::spawn(move || {
        let status = child.wait();
        for p in pumps {
            let _ = p.join();
        }
        groups.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        let code = match status {
            Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
            Err(_) => -1,
        };
        send(&out, &Frame::exit(id, code));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_resync() {
        let mut b = Vec::new();
        b.extend_from_slice(b"garbage\x55");
        write_frame(&mut b, &Frame::new(kind::STDOUT, 7, b"hello".to_vec())).unwrap();
        write_frame(&mut b, &Frame::exit(7, 3)).unwrap();
        let mut r = &b[..];
        let f = read_frame(&mut r).unwrap();
        assert_eq!(f, Frame::new(kind::STDOUT, 7, b"hello".to_vec()));
        let e = read_frame(&mut r).unwrap();
        assert_eq!((e.kind, e.exit_code()), (kind::EXIT, 3));
        assert_eq!(
            read_frame(&mut r).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn oversized_frame_is_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[kind::STDOUT, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
        assert!(read_frame(&mut &b[..]).is_err());
    }
}
