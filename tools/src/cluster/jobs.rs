//! Background jobs of a persistent cluster (`cluster exec --detach`): a
//! command that outlives the request that started it, its output appended
//! to a log on the host, its end recorded for `cluster status`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use super::agent::{kind, Frame};
use super::protocol::{JobState, JobStatus};

struct Job {
    job: u32,
    node: u32,
    /// The agent stream the command runs on (signals go to it).
    stream: u32,
    command: String,
    started: Instant,
    state: JobState,
    log: PathBuf,
}

/// Every job a supervisor started, in order.
pub struct Jobs {
    dir: PathBuf,
    list: Mutex<Vec<Job>>,
}

impl Jobs {
    /// Jobs whose logs go under `dir/jobs`.
    pub fn new(dir: &Path) -> Self {
        Jobs {
            dir: dir.join("jobs"),
            list: Mutex::new(Vec::new()),
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Job>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a job for `command` on `node`, carried by agent stream
    /// `stream`, with a new log; then appends what `frames` brings to
    /// the log until the stream ends. Returns the job's status.
    pub fn start(
        self: &Arc<Self>,
        node: u32,
        stream: u32,
        command: &str,
        frames: mpsc::Receiver<Frame>,
    ) -> anyhow::Result<JobStatus> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.dir.display()))?;
        let mut list = self.list();
        let job = list.last().map_or(1, |j| j.job + 1);
        let log = self.dir.join(format!("job{job}-node{node}.log"));
        let file = File::create(&log).map_err(|e| anyhow::anyhow!("{}: {e}", log.display()))?;
        list.push(Job {
            job,
            node,
            stream,
            command: command.to_string(),
            started: Instant::now(),
            state: JobState::Running,
            log,
        });
        let status = list
            .last()
            .map(status)
            .ok_or_else(|| anyhow::anyhow!("no job"))?;
        drop(list);
        let jobs = self.clone();
        std::thread::spawn(move || jobs.record(job, file, frames));
        Ok(status)
    }

    /// Appends the job's output to its log until its stream ends.
    fn record(&self, job: u32, mut file: File, frames: mpsc::Receiver<Frame>) {
        let mut end = JobState::Lost {
            reason: "the supervisor dropped its stream".into(),
        };
        for f in frames {
            match f.kind {
                kind::STDOUT | kind::STDERR => {
                    // A full disk loses output, not the job.
                    let _ = file.write_all(&f.data);
                }
                kind::EXIT => {
                    end = JobState::Exited {
                        code: f.exit_code(),
                    };
                    break;
                }
                kind::ERROR => {
                    end = JobState::Lost {
                        reason: String::from_utf8_lossy(&f.data).into_owned(),
                    };
                    break;
                }
                _ => {}
            }
        }
        if let Some(j) = self.list().iter_mut().find(|j| j.job == job) {
            j.state = end;
        }
    }

    /// The node and agent stream of running job `job`; an error saying
    /// why not otherwise.
    pub fn running(&self, job: u32) -> anyhow::Result<(u32, u32)> {
        let list = self.list();
        let j = list.iter().find(|j| j.job == job).ok_or_else(|| {
            anyhow::anyhow!("no job {job} (`ulnic cluster status` lists the jobs)")
        })?;
        match j.state {
            JobState::Running => Ok((j.node, j.stream)),
            ref s => Err(anyhow::anyhow!("job {job} is not running: {s}")),
        }
    }

    /// Every job, oldest first.
    pub fn status(&self) -> Vec<JobStatus> {
        self.list().iter().map(status).collect()
    }
}

fn status(j: &Job) -> JobStatus {
    JobStatus {
        job: j.job,
        node: j.node,
        command: j.command.clone(),
        state: j.state.clone(),
        seconds: j.started.elapsed().as_secs_f64(),
        log: j.log.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_logs_its_output_and_records_its_end() {
        let dir = std::env::temp_dir().join(format!("ulnic-jobs-{}", std::process::id()));
        let jobs = Arc::new(Jobs::new(&dir));
        let (tx, rx) = mpsc::channel();
        let s = jobs.start(2, 40, "echo hi", rx).unwrap();
        assert_eq!((s.job, s.node, s.state.clone()), (1, 2, JobState::Running));
        assert_eq!(jobs.running(1).unwrap(), (2, 40));
        tx.send(Frame::new(kind::STDOUT, 40, b"hi\n".to_vec()))
            .unwrap();
        tx.send(Frame::new(kind::STDERR, 40, b"warn\n".to_vec()))
            .unwrap();
        tx.send(Frame::exit(40, 3)).unwrap();
        let (tx2, rx2) = mpsc::channel();
        assert_eq!(jobs.start(0, 41, "sleep 9", rx2).unwrap().job, 2);
        tx2.send(Frame::new(kind::ERROR, 41, b"the guest rebooted".to_vec()))
            .unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while jobs.status().iter().any(|j| j.state == JobState::Running) {
            assert!(Instant::now() < deadline, "jobs never ended");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let all = jobs.status();
        assert_eq!(all[0].state, JobState::Exited { code: 3 });
        assert_eq!(std::fs::read_to_string(&all[0].log).unwrap(), "hi\nwarn\n");
        assert_eq!(
            all[1].state,
            JobState::Lost {
                reason: "the guest rebooted".into()
            }
        );
        assert!(jobs
            .running(1)
            .unwrap_err()
            .to_string()
            .contains("exited 3"));
        assert!(jobs.running(9).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
