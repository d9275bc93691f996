//! The faults, at random moments from a seeded generator: SIGKILL of the daemon (restarted after a
//! delay, as systemd's `Restart=` does), of the `file` plugin's process, of one nginx worker (the
//! master starts another), and `nginx -s reload`. Each returns once the system has recovered from
//! it (what "recovered" means is per fault, below).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tributary_testkit::Nginx;

use crate::stack::{self, DaemonProc};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Daemon,
    Plugin,
    Worker,
    Reload,
}

pub const KINDS: [Kind; 4] = [Kind::Daemon, Kind::Plugin, Kind::Worker, Kind::Reload];

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Daemon => "SIGKILL daemon",
            Kind::Plugin => "SIGKILL plugin",
            Kind::Worker => "SIGKILL nginx worker",
            Kind::Reload => "nginx -s reload",
        }
    }

    /// The next fault: the first four are each kind once (shuffled), then drawn with weights
    /// daemon 1, plugin 1, worker 1.2, reload 0.8.
    pub fn draw(rng: &mut fastrand::Rng, n: usize, first: &[Kind; 4]) -> Kind {
        if n < 4 {
            return first[n];
        }
        let x = rng.f64() * 4.0;
        if x < 1.0 {
            Kind::Daemon
        } else if x < 2.0 {
            Kind::Plugin
        } else if x < 3.2 {
            Kind::Worker
        } else {
            Kind::Reload
        }
    }
}

/// What one fault did.
#[derive(Debug, Clone)]
pub struct Done {
    /// The pid signalled (daemon, plugin, worker), if any.
    pub pid: Option<u32>,
    /// Free text for the report (restart delay, new pids...).
    pub detail: String,
    /// The fault could not be made (no plugin process at that moment...) or recovery failed.
    pub problem: Option<String>,
}

fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// SIGKILL, then after `restart_delay` start it again (returns once its health check answers).
pub fn kill_daemon(d: &mut DaemonProc, restart_delay: Duration) -> Done {
    let pid = d.kill9();
    std::thread::sleep(restart_delay);
    let problem = d.spawn().err();
    Done {
        pid,
        detail: format!(
            "restarted after {} ms as pid {:?}",
            restart_delay.as_millis(),
            d.pid()
        ),
        problem,
    }
}

/// SIGKILL the plugin process (the host starts it again at its next call, after its back-off).
pub fn kill_plugin(d: &DaemonProc) -> Done {
    let Some(daemon) = d.pid() else {
        return Done {
            pid: None,
            detail: String::new(),
            problem: Some("no daemon".into()),
        };
    };
    let mut pid = None;
    // The host starts the plugin at its first call: wait for one.
    wait_for(Duration::from_secs(15), || {
        pid = stack::plugin_pid(daemon);
        pid.is_some()
    });
    let Some(pid) = pid else {
        return Done {
            pid: None,
            detail: String::new(),
            problem: Some("no plugin process in 15 s".into()),
        };
    };
    stack::signal(pid, "KILL");
    let gone = wait_for(Duration::from_secs(5), || {
        stack::cmdline(pid).is_empty() || is_zombie(pid)
    });
    Done {
        pid: Some(pid),
        detail: String::new(),
        problem: (!gone).then(|| format!("plugin {pid} still there 5 s after SIGKILL")),
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// SIGKILL one accepting worker; recovered when the master runs 2 accepting workers again.
pub fn kill_worker(front: &Nginx, rng: &mut fastrand::Rng) -> Done {
    let workers = stack::live_workers(front);
    if workers.is_empty() {
        return Done {
            pid: None,
            detail: String::new(),
            problem: Some("no accepting worker".into()),
        };
    }
    let pid = workers[rng.usize(..workers.len())];
    stack::signal(pid, "KILL");
    let mut now = Vec::new();
    let ok = wait_for(Duration::from_secs(10), || {
        now = stack::live_workers(front);
        now.len() == 2 && !now.contains(&pid)
    });
    Done {
        pid: Some(pid),
        detail: format!("workers now {now:?}"),
        problem: (!ok).then(|| format!("no 2 accepting workers 10 s after killing {pid}: {now:?}")),
    }
}

/// `nginx -s reload`; recovered when 2 accepting workers run that were not there before (older
/// ones may still finish long requests while "shutting down").
pub fn reload(front: &Nginx) -> Done {
    let before = stack::live_workers(front);
    let cmd = front.reload_cmd();
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output();
    if let Err(e) = &out {
        return Done {
            pid: None,
            detail: String::new(),
            problem: Some(format!("reload: {e}")),
        };
    }
    let mut now = Vec::new();
    let ok = wait_for(Duration::from_secs(20), || {
        now = stack::live_workers(front);
        now.len() == 2 && now.iter().all(|p| !before.contains(p))
    });
    Done {
        pid: None,
        detail: format!("workers {before:?} -> {now:?}"),
        problem: (!ok)
            .then(|| format!("no new generation of 2 workers 20 s after the reload: {now:?}")),
    }
}
