//! `bench apps`' server shapes (issue 46): three ways real servers wait,
//! each with Debian's own load generator, at 1 client (latency) and at
//! many (throughput):
//!
//! - memcached: a libevent server whose listener thread hands accepted
//!   connections to worker threads through pipes; `memcaslap` (libmemcached-tools)
//!   drives it (90 % get, 10 % set);
//! - nginx: a master that forks workers, which wait in `epoll_wait` with
//!   signals, and share the listener (EPOLLEXCLUSIVE); ApacheBench (`ab`)
//!   fetches a 512-byte page;
//! - lighttpd: one event-driven process; `ab` as for nginx.

use std::path::Path;

/// A server shape (`bench apps`' memcached, nginx, lighttpd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// memcached under memcaslap.
    Memcached,
    /// nginx under ApacheBench.
    Nginx,
    /// lighttpd under ApacheBench.
    Lighttpd,
}

/// The page the HTTP servers serve.
const PAGE_BYTES: usize = 512;

/// The server program and its arguments for `app` on `port`, writing any
/// configuration it needs into `scratch` first.
pub fn server(
    app: Shape,
    port: u16,
    scratch: &Path,
) -> anyhow::Result<(&'static str, Vec<String>)> {
    let dir = scratch.display().to_string();
    Ok(match app {
        Shape::Memcached => (
            "memcached",
            ["-p", &port.to_string(), "-U", "0", "-t", "2", "-u", "root"]
                .map(String::from)
                .to_vec(),
        ),
        Shape::Nginx => {
            let www = www(scratch)?;
            let conf = scratch.join(format!("nginx-{port}.conf"));
            // Every path nginx writes is in the scratch directory; the
            // master stays in the foreground, its two workers are forked.
            let text = format!(
                "daemon off;\nmaster_process on;\nworker_processes 2;\nuser root;\n\
                 pid {dir}/nginx-{port}.pid;\nerror_log {dir}/nginx-{port}.err;\n\
                 events {{ worker_connections 512; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {dir}/nginx-body;\n\
                 proxy_temp_path {dir}/nginx-proxy;\n  fastcgi_temp_path {dir}/nginx-fcgi;\n\
                 uwsgi_temp_path {dir}/nginx-uwsgi;\n  scgi_temp_path {dir}/nginx-scgi;\n\
                 server {{ listen {port}; root {www}; }}\n}}\n"
            );
            std::fs::write(&conf, text)?;
            let args = ["-c", &conf.display().to_string(), "-p", &dir];
            ("nginx", args.map(String::from).to_vec())
        }
        Shape::Lighttpd => {
            let www = www(scratch)?;
            let conf = scratch.join(format!("lighttpd-{port}.conf"));
            let text = format!(
                "server.document-root = \"{www}\"\nserver.port = {port}\n\
                 server.errorlog = \"{dir}/lighttpd-{port}.err\"\n"
            );
            std::fs::write(&conf, text)?;
            let args = ["-D", "-f", &conf.display().to_string()];
            ("lighttpd", args.map(String::from).to_vec())
        }
    })
}

/// The document root, with its page.
fn www(scratch: &Path) -> anyhow::Result<String> {
    let www = scratch.join("www");
    std::fs::create_dir_all(&www)?;
    let mut page = "<html><body>ulnic bench apps</body></html>\n".to_string();
    while page.len() < PAGE_BYTES {
        page.push('.');
    }
    std::fs::write(www.join("index.html"), &page[..PAGE_BYTES])?;
    Ok(www.display().to_string())
}

/// The load generator and its arguments: `clients` connections, each
/// with one request outstanding, for `seconds`.
pub fn client(
    app: Shape,
    addr: &str,
    port: u16,
    clients: u32,
    seconds: u32,
) -> (&'static str, Vec<String>) {
    match app {
        Shape::Memcached => (
            "memcaslap",
            vec![
                "-s".into(),
                format!("{addr}:{port}"),
                "-c".into(),
                clients.to_string(),
                "-T".into(),
                "1".into(),
                "-t".into(),
                format!("{seconds}s"),
            ],
        ),
        Shape::Nginx | Shape::Lighttpd => (
            "ab",
            vec![
                // ab stops at -n or -t, whichever comes first.
                "-t".into(),
                seconds.to_string(),
                "-n".into(),
                "10000000".into(),
                "-c".into(),
                clients.to_string(),
                "-q".into(),
                format!("http://{addr}:{port}/index.html"),
            ],
        ),
    }
}

/// Requests per second and the mean time per request (microseconds) from
/// the load generator's output; an error names what was wrong (failed
/// requests count as an error: a benchmark of errors measures nothing).
pub fn parse(app: Shape, clients: u32, text: &str) -> anyhow::Result<(f64, f64)> {
    match app {
        Shape::Memcached => {
            // "Run time: 2.0s Ops: 50791 TPS: 25394 Net_rate: 28.4M/s"
            let tps = text
                .lines()
                .filter(|l| l.starts_with("Run time:"))
                .filter_map(|l| l.split("TPS:").nth(1))
                .filter_map(|r| r.split_whitespace().next())
                .find_map(|v| v.parse::<f64>().ok())
                .filter(|&t| t > 0.0)
                .ok_or_else(|| anyhow::anyhow!("no TPS in memcaslap's output: {text}"))?;
            // One request outstanding per connection: the mean time per
            // request is the connections over the rate (Little's law).
            Ok((tps, f64::from(clients) * 1e6 / tps))
        }
        Shape::Nginx | Shape::Lighttpd => {
            let field = |name: &str| {
                text.lines()
                    .find(|l| l.starts_with(name))
                    .and_then(|l| l.split(':').nth(1))
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|v| v.parse::<f64>().ok())
            };
            let failed = field("Failed requests").unwrap_or(0.0);
            let non2xx = field("Non-2xx responses").unwrap_or(0.0);
            anyhow::ensure!(
                failed == 0.0 && non2xx == 0.0,
                "ab counted {failed} failed and {non2xx} non-2xx requests: {text}"
            );
            let rps = field("Requests per second").filter(|&r| r > 0.0);
            // The first "Time per request" is per client's request.
            let mean_ms = field("Time per request");
            match (rps, mean_ms) {
                (Some(r), Some(m)) => Ok((r, m * 1e3)),
                _ => anyhow::bail!("no rate or time per request in ab's output: {text}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcaslap_summary_is_read() {
        let text = "cmd_get: 45711\nRun time: 2.0s Ops: 50791 TPS: 25394 Net_rate: 28.4M/s\n";
        let (tps, mean) = parse(Shape::Memcached, 20, text).unwrap();
        assert_eq!(tps, 25394.0);
        assert!((mean - 20.0 * 1e6 / 25394.0).abs() < 1e-9);
        assert!(parse(Shape::Memcached, 1, "connect failed").is_err());
    }

    #[test]
    fn ab_summary_is_read_and_failures_refused() {
        let text = "Complete requests:      500\nFailed requests:        0\n\
                    Requests per second:    2882.11 [#/sec] (mean)\n\
                    Time per request:       0.347 [ms] (mean)\n\
                    Time per request:       0.017 [ms] (mean, across all concurrent requests)\n";
        let (rps, mean) = parse(Shape::Nginx, 1, text).unwrap();
        assert_eq!(rps, 2882.11);
        assert!((mean - 347.0).abs() < 1e-9);
        let bad = text.replace("Failed requests:        0", "Failed requests:        3");
        assert!(parse(Shape::Lighttpd, 1, &bad).is_err());
    }

    #[test]
    fn configurations_are_written_into_scratch() {
        let dir = tempfile::tempdir().unwrap();
        let (prog, args) = server(Shape::Nginx, 8080, dir.path()).unwrap();
        assert_eq!(prog, "nginx");
        let conf = std::fs::read_to_string(&args[1]).unwrap();
        assert!(conf.contains("listen 8080;") && conf.contains("worker_processes 2;"));
        let page = std::fs::read(dir.path().join("www/index.html")).unwrap();
        assert_eq!(page.len(), PAGE_BYTES);
        let (_, args) = server(Shape::Lighttpd, 8090, dir.path()).unwrap();
        assert!(std::fs::read_to_string(&args[2])
            .unwrap()
            .contains("server.port = 8090"));
    }
}
