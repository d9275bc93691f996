//! Process facts from `/proc` (children of nginx's master, resident memory), signals sent by
//! process id (only to processes the harness started or their children), and the bounded stop of a
//! master with its workers ([`stop_master`]) that both nginx fixtures use.

use std::fs;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

/// Signals the harness sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    /// Graceful shutdown (nginx: finish requests, then exit).
    Quit,
    /// Reload the configuration (nginx master).
    Hup,
    /// Interrupt (wrk: stop and print the summary).
    Int,
    /// Kill.
    Kill,
    /// Terminate (nginx master: fast shutdown).
    Term,
}

/// Sends `sig` to process `pid`; false when it does not exist.
pub fn signal(pid: u32, sig: Sig) -> bool {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    let s = match sig {
        Sig::Quit => Signal::QUIT,
        Sig::Hup => Signal::HUP,
        Sig::Int => Signal::INT,
        Sig::Kill => Signal::KILL,
        Sig::Term => Signal::TERM,
    };
    kill_process(p, s).is_ok()
}

/// `(state, parent pid)` from `/proc/PID/stat`; `None` when the process is gone.
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ppid ...`: comm may hold spaces and parentheses; it ends at the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` is alive (exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(s, _)| s != 'Z')
}

/// Live (non-zombie) children of `pid`, in ascending pid order: the `children` lists of its
/// threads (`/proc/PID/task/*/children`), else a scan of `/proc`.
pub fn children(pid: u32) -> Vec<u32> {
    let from_tasks = fs::read_dir(format!("/proc/{pid}/task")).ok().map(|tasks| {
        tasks
            .filter_map(|t| fs::read_to_string(t.ok()?.path().join("children")).ok())
            .flat_map(|text| {
                text.split_whitespace()
                    .filter_map(|c| c.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect::<Vec<u32>>()
    });
    let listed = match from_tasks {
        Some(l) if Path::new(&format!("/proc/{pid}/task/{pid}/children")).exists() => l,
        _ => fs::read_dir("/proc")
            .map(|dir| {
                dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    let mut out: Vec<u32> = listed
        .into_iter()
        .filter(|c| stat(*c).is_some_and(|(s, ppid)| ppid == pid && s != 'Z'))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Resident set size of `pid` in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// CPU time `pid` used so far (user + system), in clock ticks (`utime` + `stime` of
/// `/proc/PID/stat`); see [`clock_ticks_per_second`].
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // After the command: state is field 0, utime 11, stime 12.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second of [`cpu_ticks`] (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

/// The process title (`/proc/PID/cmdline` with NULs as spaces), e.g. `nginx: worker process`.
pub fn title(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .replace('\0', " ")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// How [`stop_master`] ended.
#[derive(Debug)]
pub enum Stopped {
    /// The master exited by itself within the time limit.
    Exited(ExitStatus),
    /// It did not: it and these children (its workers) were killed.
    Killed {
        /// The master's children when it was killed.
        workers: Vec<u32>,
    },
}

/// Sends `sig` to `master` (a running process) and waits up to `timeout` for it to exit. When it
/// does not, SIGKILLs its children and it, reaps it, and waits (at most 3 s) until the killed
/// children are gone, so no worker outlives the fixture.
pub fn stop_master(master: &mut Child, sig: Sig, timeout: Duration) -> Stopped {
    let pid = master.id();
    signal(pid, sig);
    let deadline = Instant::now() + timeout;
    loop {
        match master.try_wait() {
            Ok(Some(status)) => return Stopped::Exited(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => break,
        }
    }
    // Workers are children of the live master: their pids cannot have been reused yet.
    let workers = children(pid);
    for &w in &workers {
        signal(w, Sig::Kill);
    }
    let _ = master.kill();
    let _ = master.wait();
    // A SIGKILLed worker dies when the kernel next schedules it (later on a loaded machine) and
    // is then reaped by whoever inherited it: return once none is alive, bounded.
    let deadline = Instant::now() + Duration::from_secs(3);
    while workers.iter().any(|&w| alive(w)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Stopped::Killed { workers }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_with_memory_and_a_child_is_listed() {
        let me = std::process::id();
        assert!(alive(me));
        assert!(rss_kib(me).is_some_and(|k| k > 0));
        assert!(cpu_ticks(me).is_some());
        assert!(clock_ticks_per_second() > 0);
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let kids = children(me);
        let killed = signal(c.id(), Sig::Kill);
        c.wait().unwrap();
        assert!(kids.contains(&c.id()), "{} not in {kids:?}", c.id());
        assert!(killed);
        assert!(!children(me).contains(&c.id()));
        assert!(!alive(c.id()));
    }

    /// A process that ignores the stop signal is killed with its children after the time limit;
    /// one that obeys exits by itself.
    #[test]
    fn stop_master_kills_a_process_that_ignores_the_signal_and_its_children() {
        let mut stubborn = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM; sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = stubborn.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while children(pid).len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let kids = children(pid);
        assert_eq!(kids.len(), 2, "{kids:?}");
        match stop_master(&mut stubborn, Sig::Term, Duration::from_millis(300)) {
            Stopped::Killed { workers } => assert_eq!(workers, kids),
            other => panic!("expected a kill, got {other:?}"),
        }
        assert!(kids.iter().all(|&k| !alive(k)), "{kids:?} still alive");
        let mut obedient = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let got = stop_master(&mut obedient, Sig::Term, Duration::from_secs(5));
        assert!(matches!(got, Stopped::Exited(_)), "{got:?}");
    }
}
