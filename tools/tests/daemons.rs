//! Debian's own servers as daemons between two guests, unmodified, over
//! ulnic (the LD_PRELOAD layer), started as background jobs
//! (`cluster exec --detach`) on a cluster with the default settings:
//! - Apache's prefork MPM (a master that listens, workers forked before
//!   any connection, each serving one connection at a time, retired after
//!   three and forked again) serving a 10 MiB file, sha256-checked, to 8
//!   clients at once, with sendfile on and off;
//! - nginx with its packaged configuration (/etc/nginx/nginx.conf: user
//!   www-data, its log directories), serving its welcome page and the
//!   same file.
//!
//! - 1,000 connections open at once between one server process and one
//!   client process;
//! - event libraries and runtimes: libevent, asyncio, Node.js (a cluster
//!   of their own), and the preload layer's epoll model with its blocking
//!   waits (threads and forked children changing what another waits on)
//!   inside a guest, on the Linux driver's watchers.
//!
//! Each server's eth0 counters show the bytes did not go through the
//! kernel's network.
mod cli;
use cli::{run as ulnic, text, Down};
use std::process::Command;

/// Every process under the layer appends how its waits ended to
/// `/tmp/wakes` (docs/sockets.md §6), checked by `no_wakeup_found_by_timer`.
const LAYER: &str =
    "LD_PRELOAD=/lib/libulnic_preload.so ULNIC_INET=10.81.0.0/24 ULNIC_STATS=/tmp/wakes";

/// Fails if a process under the layer on either node reported a wake-up
/// found by timer (a lost one); the lines reported.
fn no_wakeup_found_by_timer() -> String {
    let said = exec("all", "cat /tmp/wakes 2>/dev/null; true");
    for l in said.lines().filter(|l| l.contains("wakes pid")) {
        assert!(
            l.contains("found_by_timer 0 "),
            "a lost wake-up: {l}\n{said}"
        );
    }
    said
}
const BIG: &str = "/srv/www/big.bin";
const ROUNDS: usize = 2;
const PARALLEL: usize = 8;

thread_local! {
    /// The cluster this test thread works on.
    static CLUSTER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn name() -> String {
    CLUSTER.with(|c| c.borrow().clone())
}

/// Boots cluster `suffix` (2 TCG guests with `packages`, and `extra`
/// options) for this thread; it goes down when the guard drops. One test
/// boots at a time: two TCG clusters would share 2 cores.
fn cluster_up(
    suffix: &str,
    packages: &str,
    extra: &[&str],
) -> (Down, std::sync::MutexGuard<'static, ()>) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let n = format!("test-{suffix}-{}", std::process::id());
    CLUSTER.with(|c| *c.borrow_mut() = n.clone());
    let down = Down(n.clone());
    let mut args = vec![
        "cluster",
        "up",
        "--nodes",
        "2",
        "--accel",
        "tcg",
        "--packages",
        packages,
        "--name",
        &n,
    ];
    args.extend_from_slice(extra);
    let up = ulnic(&args);
    assert!(up.status.success(), "cluster up:\n{}", text(&up));
    (down, turn)
}

/// Takes cluster `.0` down however the test ends.
/// Runs `cmd` on `node`; its standard output, or a panic with everything.
fn exec(node: &str, cmd: &str) -> String {
    let o = ulnic(&["cluster", "exec", node, "--name", &name(), "--", cmd]);
    assert!(o.status.success(), "{cmd}:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn put(node: &str, contents: &str, remote: &str) {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), contents).unwrap();
    put_file(node, f.path(), remote);
}

fn status() -> serde_json::Value {
    let o = ulnic(&["cluster", "status", "--name", &name(), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Starts `cmd` on node 1 as a background job; its number.
fn detach(cmd: &str) -> u64 {
    let o = ulnic(&[
        "cluster",
        "exec",
        "--detach",
        "1",
        "--name",
        &name(),
        "--",
        cmd,
    ]);
    assert!(o.status.success(), "exec --detach:\n{}", text(&o));
    let s = status();
    let job = s["jobs"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(job["command"], cmd, "{s}");
    job["job"].as_u64().unwrap()
}

/// Waits until `check` succeeds on node 1, or fails with the job's log.
fn wait_for(check: &str, job: u64, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let o = ulnic(&["cluster", "exec", "1", "--name", &name(), "--", check]);
        if o.status.success() {
            return;
        }
        let s = status();
        let j = &s["jobs"][job as usize - 1];
        if j["state"] != "running" || std::time::Instant::now() > deadline {
            let log = std::fs::read_to_string(j["log"].as_str().unwrap()).unwrap_or_default();
            panic!("no {what}: job {j}\nits log:\n{log}");
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// Stops job `job` and checks `cluster status` saw it end.
fn stop(job: u64) {
    let o = ulnic(&["cluster", "kill", &job.to_string(), "--name", &name()]);
    assert!(o.status.success(), "kill:\n{}", text(&o));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let s = status();
        let j = &s["jobs"][job as usize - 1];
        if j["state"] == "exited" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "job still {j}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// eth0's received and sent packets on node 1.
fn eth0_packets() -> (u64, u64) {
    let out = exec("1", "grep eth0: /proc/net/dev");
    let f: Vec<u64> = out
        .split_whitespace()
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect();
    (f[1], f[9])
}

/// `ROUNDS` rounds of `PARALLEL` fetches of `url` at once from node 0
/// under the layer: one line per fetch, "sha256 size".
fn fetch_all(url: &str) -> Vec<String> {
    let script = format!(
        "for r in $(seq {ROUNDS}); do for i in $(seq {PARALLEL}); do \
           ( s=$({LAYER} curl -sS -w '%{{stderr}}%{{size_download}}' {url} 2>/tmp/size$i \
               | sha256sum | cut -d' ' -f1); echo \"$s $(cat /tmp/size$i)\" ) & \
         done; wait; done"
    );
    exec("0", &script).lines().map(str::to_string).collect()
}

fn assert_all_fetched(lines: &[String], sha: &str, what: &str) {
    assert_eq!(lines.len(), ROUNDS * PARALLEL, "{what}: {lines:?}");
    for l in lines {
        assert_eq!(l, &format!("{sha} 10485760"), "{what}: {lines:?}");
    }
}

const HTTPD_CONF: &str = "\
ServerRoot /srv
ServerName node1
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
Listen 0.0.0.0:8080
User www-data
Group www-data
PidFile /run/httpd-test.pid
Mutex file:/run default
ErrorLog /tmp/httpd-error.log
LogFormat \"%P %>s %B %U\" workers
CustomLog /tmp/httpd-access.log workers
DocumentRoot /srv/www
<Directory /srv/www>
    Require all granted
</Directory>
StartServers 4
MinSpareServers 4
MaxSpareServers 8
MaxRequestWorkers 16
MaxConnectionsPerChild 3
";

/// Apache prefork with sendfile `on`: every fetch whole, served by at
/// least 4 workers, none of it on eth0.
fn apache_prefork(sendfile: &str, sha: &str) {
    put(
        "1",
        &format!("{HTTPD_CONF}EnableSendfile {sendfile}\n"),
        "/etc/httpd-test.conf",
    );
    exec("1", ": > /tmp/httpd-access.log");
    let job = detach(&format!(
        "{LAYER} apache2 -f /etc/httpd-test.conf -DFOREGROUND"
    ));
    // The master and its four workers.
    wait_for(
        "[ $(ps | grep -c '^ *[0-9]* www-data *apache2 -f /etc/httpd-test') -ge 4 ]",
        job,
        "Apache workers",
    );
    let before = eth0_packets();
    let got = fetch_all("http://node1:8080/big.bin");
    let after = eth0_packets();
    assert_all_fetched(&got, sha, &format!("Apache, sendfile {sendfile}"));
    let log = exec("1", "cat /tmp/httpd-access.log");
    let mut workers: Vec<&str> = log
        .lines()
        .filter(|l| l.ends_with(" /big.bin"))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(workers.len(), ROUNDS * PARALLEL, "{log}");
    workers.sort();
    workers.dedup();
    eprintln!(
        "Apache prefork, sendfile {sendfile}: {} fetches of 10 MiB by {} workers; eth0 {:?} -> {:?}",
        ROUNDS * PARALLEL,
        workers.len(),
        before,
        after
    );
    assert!(workers.len() >= 4, "workers {workers:?}\n{log}");
    assert!(
        after.0 - before.0 < 100 && after.1 - before.1 < 100,
        "the bytes went over eth0: {before:?} -> {after:?}"
    );
    stop(job);
}

/// nginx as Debian packages it: its own nginx.conf, workers as www-data,
/// logs in /var/log/nginx.
fn nginx_packaged(sha: &str) {
    // What nginx-common's postinst would do (maintainer scripts are not
    // run in the guests): enable the default site, make its index page.
    exec(
        "1",
        "ln -sf /etc/nginx/sites-available/default /etc/nginx/sites-enabled/default && \
         mkdir -p /var/www/html && \
         cp /usr/share/nginx/html/index.html /var/www/html/index.nginx-debian.html && \
         cp /srv/www/big.bin /var/www/html/",
    );
    let job = detach(&format!("{LAYER} nginx -g 'daemon off;'"));
    wait_for(
        "ps | grep -q '^ *[0-9]* www-data *nginx: worker'",
        job,
        "nginx worker",
    );
    let page = exec(
        "0",
        &format!("{LAYER} curl -sS http://node1/ && {LAYER} curl -sS -o /dev/null -w '%{{http_code}}' http://node1/absent"),
    );
    assert!(page.contains("Welcome to nginx!"), "{page}");
    assert!(page.ends_with("404"), "{page}");
    assert_all_fetched(&fetch_all("http://node1/big.bin"), sha, "nginx");
    let who = exec("1", "ps | grep 'nginx: ' | grep -v grep");
    assert!(
        who.lines()
            .any(|l| l.contains("root") && l.contains("master"))
            && who
                .lines()
                .filter(|l| l.contains("worker"))
                .all(|l| l.contains("www-data")),
        "nginx's processes:\n{who}"
    );
    let log = exec("1", "cat /var/log/nginx/access.log");
    assert_eq!(
        log.lines().filter(|l| l.contains("GET /big.bin")).count(),
        ROUNDS * PARALLEL,
        "{log}"
    );
    stop(job);
}

/// `gcc src -o /bin/NAME` on the host (with `libs`), put on every node.
fn build_and_put(src: &str, libs: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let src = format!(
        "{}/../guest-lib/preload/tests/progs/{src}",
        env!("CARGO_MANIFEST_DIR")
    );
    let stem = std::path::Path::new(&src).file_stem().unwrap().to_owned();
    let bin = dir.path().join(&stem);
    let cc = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", &src])
        .args(libs)
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(cc.status.success(), "gcc {src}:\n{}", text(&cc));
    put_file("all", &bin, &format!("/bin/{}", stem.to_string_lossy()));
}

fn put_file(node: &str, local: &std::path::Path, remote: &str) {
    let o = ulnic(&[
        "cluster",
        "put",
        node,
        local.to_str().unwrap(),
        remote,
        "--name",
        &name(),
    ]);
    assert!(o.status.success(), "cluster put {remote}:\n{}", text(&o));
}

/// A job's status and its log.
fn job_log(job: u64) -> (serde_json::Value, String) {
    let s = status();
    let j = s["jobs"][job as usize - 1].clone();
    let log = std::fs::read_to_string(j["log"].as_str().unwrap()).unwrap_or_default();
    (j, log)
}

/// `server` as a job on node 1 (under the layer) until it says "ready",
/// then `client` on node 0 (under the layer), which must print
/// `client_ok`; then the server must end with status 0 having printed
/// `server_ok`. Returns both outputs.
fn pair(server: &str, client: &str, client_ok: &str, server_ok: &str) -> (String, String) {
    let job = detach(&format!("{LAYER} {server}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !job_log(job).1.contains("ready") {
        assert!(
            std::time::Instant::now() < deadline,
            "{server}: {:?}",
            job_log(job)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let o = ulnic(&[
        "cluster",
        "exec",
        "0",
        "--name",
        &name(),
        "--",
        &format!("{LAYER} {client}"),
    ]);
    assert!(
        o.status.success() && text(&o).contains(client_ok),
        "{client}:\n{}\nserver: {:?}",
        text(&o),
        job_log(job)
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (j, log) = loop {
        let (j, log) = job_log(job);
        if j["state"] != "running" || std::time::Instant::now() > deadline {
            break (j, log);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        j["code"] == 0 && log.contains(server_ok),
        "{server}: {j}\n{log}"
    );
    no_wakeup_found_by_timer();
    (String::from_utf8_lossy(&o.stdout).into_owned(), log)
}

/// 1,000 connections open at once between the guests with the default
/// settings: one server process holds them all in one epoll set, one
/// client process opens them all before it sends on any, then checks
/// every echo. Each connection is an endpoint (1,024 a node by default)
/// and its buffers shrink as the driver's endpoint memory fills.
fn thousand_connections() {
    build_and_put("sockcheck.c", &[]);
    let (clients, log) = pair(
        "sockcheck hold-server 7600 1000",
        "sockcheck hold-clients 10.81.0.2 7600 1000",
        "ok 1000 connections open at once, each echoed",
        "ok hold-server: 1000 connections, 1000 open at once",
    );
    eprintln!("{}\n{}", clients.trim(), log.trim());
}

/// Event libraries and runtimes between the guests: a libevent echo pair
/// (bufferevents over epoll, linked statically with libevent_core), an
/// asyncio echo pair (Debian's python3) and a Node.js HTTP pair (Debian's
/// nodejs, libuv), every byte checked by the programs.
fn event_libraries() {
    build_and_put(
        "evecho.c",
        &["-Wl,-Bstatic", "-levent_core", "-Wl,-Bdynamic"],
    );
    let progs = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../guest-lib/preload/tests/progs"
    );
    for f in ["asyncio_echo.py", "node_http.js"] {
        put_file(
            "all",
            std::path::Path::new(&format!("{progs}/{f}")),
            &format!("/opt/{f}"),
        );
    }
    let runs = [
        pair(
            "evecho server 7610 20",
            "evecho client 10.81.0.2 7610 20 200000",
            "ok libevent client: 20 connections",
            "ok libevent server: 20 connections echoed",
        ),
        pair(
            "python3 /opt/asyncio_echo.py server 7611 30",
            "python3 /opt/asyncio_echo.py client 10.81.0.2 7611 30",
            "ok asyncio clients: 30 connections",
            "ok asyncio server: 30 connections echoed",
        ),
        pair(
            "node /opt/node_http.js server 7612 40",
            "node /opt/node_http.js client 10.81.0.2 7612 40",
            "ok node client: 40 requests",
            "ok node server: 40 requests answered",
        ),
    ];
    for (client, _) in runs {
        eprintln!("{}", client.trim());
    }
}

#[test]
fn debian_daemons_serve_between_guests() {
    // The default settings (512 MiB guests, 1,024 endpoints a node).
    let (_down, _turn) = cluster_up("daemons", "apache2-bin,nginx,curl", &[]);
    let n = name();
    // A job's output lands in its log; its end is recorded.
    let job = detach("echo started; sleep 1; echo done >&2; exit 3");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let j = loop {
        let s = status();
        let j = s["jobs"][job as usize - 1].clone();
        if j["state"] != "running" || std::time::Instant::now() > deadline {
            break j;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(
        (&j["state"], &j["code"]),
        (&"exited".into(), &3.into()),
        "{j}"
    );
    let log = std::fs::read_to_string(j["log"].as_str().unwrap()).unwrap();
    assert_eq!(log, "started\ndone\n");
    let o = ulnic(&["cluster", "kill", &job.to_string(), "--name", &n]);
    assert!(
        !o.status.success() && text(&o).contains("is not running: exited 3"),
        "{}",
        text(&o)
    );
    let sha = exec(
        "1",
        &format!("mkdir -p /srv/www && head -c 10485760 /dev/urandom > {BIG} && sha256sum {BIG}"),
    );
    let sha = sha.split_whitespace().next().unwrap().to_string();
    thousand_connections();
    apache_prefork("On", &sha);
    apache_prefork("Off", &sha);
    nginx_packaged(&sha);
    no_wakeup_found_by_timer();
    let table = ulnic(&["cluster", "status", "--name", &n]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.contains("job 5 on node 1: exited") && table.contains("jobs/job5-node1.log"),
        "{table}"
    );
}

/// Sequences for the epoll model (guest-lib/preload/tests/epoll_model.rs
/// generates its own on the host): seeded, so a failure repeats, and
/// weighted towards the blocking waits whose wake-ups come from another
/// thread or process (`bwait`, `bpoll`, `tread`, `dwait`, `fwait`).
fn model_sequences(count: usize, seed: u64) -> String {
    use rand::{Rng, SeedableRng};
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let streams = ["c0", "s0", "c1", "s1"];
    let names = ["c0", "s0", "c1", "s1", "p"];
    let mut out = String::new();
    for _ in 0..count {
        for _ in 0..r.gen_range(1..16) {
            let set = r.gen_range(0..2);
            let st = streams[r.gen_range(0..4)];
            let bytes = r.gen_range(1..3000);
            let line = match r.gen_range(0..13) {
                0..=2 => {
                    let how = ["add", "add", "mod", "del"][r.gen_range(0..4)];
                    let mask = ["i", "o", "io", "ir", "ie", "i1", "ioe"][r.gen_range(0..7)];
                    format!("ctl {set} {how} {} {mask}", names[r.gen_range(0..5)])
                }
                3 => format!("write {st} {bytes}"),
                4 => format!("read {st} 4000"),
                5 => format!("wait {set}"),
                6 => format!("bwait {set} {st} {bytes}"),
                7 => format!("bpoll {st} {bytes}"),
                8 | 9 => format!("tread {set} {st} {bytes}"),
                10 => format!("fwait {set} {st} {bytes}"),
                11 => format!("dwait {st} {bytes}"),
                _ => "poll".to_string(),
            };
            out += &line;
            out.push('\n');
        }
        out += "end\n";
    }
    out
}

/// The preload layer's epoll model inside a guest (the Linux driver's
/// watchers under the layer, spec §9): the same seeded sequences run over
/// the guest kernel's TCP on 127.0.0.1 and over ulnic (this node's own
/// address), and must print the same; the layer must find no wake-up by
/// timer. Its blocking waits change what they wait on from other threads
/// and forked children: before watchers, a thread's epoll took the
/// wake-up of another thread blocked in a read (`tread`).
fn epoll_model_in_a_guest() {
    build_and_put("epollmodel.c", &["-lpthread"]);
    put("0", &model_sequences(30, 46), "/tmp/seq");
    let kernel = exec("0", "cat /tmp/seq | epollmodel 127.0.0.1 7620");
    let ulnic = exec(
        "0",
        &format!("rm -f /tmp/wakes; cat /tmp/seq | {LAYER} epollmodel 10.81.0.1 7621"),
    );
    let (k, u): (Vec<&str>, Vec<&str>) = (kernel.lines().collect(), ulnic.lines().collect());
    if let Some(i) = (0..k.len().max(u.len())).find(|&i| k.get(i) != u.get(i)) {
        let from = i.saturating_sub(12);
        panic!(
            "the epoll model in a guest differs at line {i}:\nkernel: {:?}\nulnic:  {:?}",
            &k[from..(i + 3).min(k.len())],
            &u[from..(i + 3).min(u.len())]
        );
    }
    let stats = no_wakeup_found_by_timer();
    assert!(stats.contains("wakes pid"), "no wake counts: {stats}");
    eprintln!(
        "epoll model in a guest: {} lines alike over kernel TCP and ulnic; {}",
        k.len(),
        stats.lines().last().unwrap_or_default()
    );
}

#[test]
fn event_libraries_between_guests() {
    // Debian's python3 and nodejs with their libraries take about 80 MiB
    // of the guests' RAM-backed root: 1 GiB guests.
    let (_down, _turn) = cluster_up("evlibs", "python3,nodejs", &["--memory", "1024"]);
    epoll_model_in_a_guest();
    event_libraries();
}
