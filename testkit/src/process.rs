//! Child processes that cannot outlive a test: killed and reaped when
//! dropped, their stdout and stderr drained by threads (no pipe is ever
//! dropped or left to fill), their lines waited for with a deadline, and
//! their stderr printed when a failing test drops them.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the reader threads have captured so far.
#[derive(Default)]
struct Captured {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Every complete line of either stream, in the order they came.
    lines: Vec<String>,
    /// Streams not yet at their end.
    open: u32,
}

type Shared = Arc<(Mutex<Captured>, Condvar)>;

fn lock(shared: &Shared) -> MutexGuard<'_, Captured> {
    shared.0.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads `from` to its end into `shared`, line by line.
fn drain(from: impl Read, shared: Shared, is_stderr: bool) {
    let mut r = BufReader::new(from);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = r.read_until(b'\n', &mut buf).unwrap_or(0);
        let mut c = lock(&shared);
        if n == 0 {
            c.open -= 1;
            shared.1.notify_all();
            return;
        }
        if is_stderr {
            c.stderr.extend_from_slice(&buf);
        } else {
            c.stdout.extend_from_slice(&buf);
        }
        let line = String::from_utf8_lossy(&buf);
        c.lines
            .push(line.trim_end_matches(['\n', '\r']).to_string());
        shared.1.notify_all();
    }
}

/// A child process of a test. Killed (SIGKILL) and reaped when dropped;
/// when that happens during a panic its captured stderr is printed.
pub struct TestChild {
    name: String,
    child: Child,
    shared: Shared,
    /// Lines before this one were already matched by `expect_line`.
    cursor: usize,
    status: Option<ExitStatus>,
}

impl TestChild {
    /// Spawns `cmd` (stdin from /dev/null, stdout and stderr captured);
    /// `name` labels it in failure messages.
    pub fn spawn(name: &str, cmd: &mut Command) -> TestChild {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        let shared: Shared = Arc::new((
            Mutex::new(Captured {
                open: 2,
                ..Captured::default()
            }),
            Condvar::new(),
        ));
        let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let s = shared.clone();
        std::thread::spawn(move || drain(out, s, false));
        let s = shared.clone();
        std::thread::spawn(move || drain(err, s, true));
        TestChild {
            name: name.to_string(),
            child,
            shared,
            cursor: 0,
            status: None,
        }
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&lock(&self.shared).stdout).into_owned()
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&lock(&self.shared).stderr).into_owned()
    }

    /// Both, labelled: for failure messages.
    pub fn said(&self) -> String {
        format!(
            "{} stdout:\n{}\n{} stderr:\n{}",
            self.name,
            self.stdout(),
            self.name,
            self.stderr()
        )
    }

    /// Waits up to `timeout` for a line of stdout or stderr, after those
    /// an earlier call matched, that contains `want`; returns it. Panics
    /// with everything the child said if none comes, or if the child's
    /// output ends first.
    pub fn expect_line(&mut self, want: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut c = lock(&self.shared);
        loop {
            if let Some(i) = c.lines[self.cursor..].iter().position(|l| l.contains(want)) {
                self.cursor += i + 1;
                return c.lines[self.cursor - 1].clone();
            }
            let now = Instant::now();
            if c.open == 0 || now >= deadline {
                let why = if c.open == 0 {
                    "its output ended"
                } else {
                    "timed out"
                };
                drop(c);
                panic!(
                    "{} never said {want:?} ({why}; allowed {timeout:?}):\n{}",
                    self.name,
                    self.said()
                );
            }
            c = self
                .shared
                .1
                .wait_timeout(c, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Its exit status, if it has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    /// Kills it (SIGKILL: no cleanup in the process) and reaps it.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(s) = self.try_wait() {
            return s;
        }
        let _ = self.child.kill();
        let s = self.child.wait().unwrap();
        self.status = Some(s);
        s
    }

    /// Waits up to `timeout` for it to end and returns its status and
    /// whole output (lines matched by `expect_line` included). Still
    /// running at the deadline, it is killed: the status says so, and the
    /// stderr returned ends with a line saying it.
    pub fn finish(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let mut killed = false;
        while self.try_wait().is_none() {
            if Instant::now() >= deadline {
                self.kill();
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Its pipes end with it, unless a process it started holds them:
        // then what was captured in the next few seconds is all.
        let ends = Instant::now() + Duration::from_secs(5);
        let mut c = lock(&self.shared);
        while c.open > 0 && Instant::now() < ends {
            c = self
                .shared
                .1
                .wait_timeout(c, ends.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mut stderr = c.stderr.clone();
        if killed {
            let note = format!(
                "[testkit: {} still running after {timeout:?}: killed]\n",
                self.name
            );
            stderr.extend_from_slice(note.as_bytes());
        }
        Output {
            status: self.status.expect("reaped above"),
            stdout: c.stdout.clone(),
            stderr,
        }
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        let running = self.try_wait().is_none();
        if running {
            self.kill();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- {} (pid {}, {}) stderr:\n{}\n--- end of {}'s stderr",
                self.name,
                self.child.id(),
                if running {
                    "killed by the test".to_string()
                } else {
                    format!("{:?}", self.status)
                },
                self.stderr(),
                self.name
            );
        }
    }
}

/// The C program at `src`, compiled once per test process with gcc
/// (`-O2 -Wall -Wextra -Werror`) into a directory that lives as long as
/// the process; panics with gcc's complaint if it does not build.
pub fn c_program(src: &std::path::Path) -> &'static std::path::Path {
    c_program_with(src, &[])
}

/// As [`c_program`], linked with `libs` (gcc arguments after the source,
/// such as `-Wl,-Bstatic -levent_core -Wl,-Bdynamic`).
pub fn c_program_with(src: &std::path::Path, libs: &[&str]) -> &'static std::path::Path {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, OnceLock};
    static BUILT: OnceLock<Mutex<HashMap<PathBuf, &'static Path>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(exe) = built.get(src) {
        return exe;
    }
    // Kept for the process's life: its programs run until the end.
    let dir: &'static tempfile::TempDir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let name = src.file_stem().unwrap_or_default();
    let exe: &'static Path = Box::leak(dir.path().join(name).into_boxed_path());
    let out = std::process::Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(src)
        .args(libs)
        .arg("-o")
        .arg(exe)
        .output()
        .expect("gcc");
    assert!(
        out.status.success(),
        "{}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    built.insert(src.to_path_buf(), exe);
    exe
}
