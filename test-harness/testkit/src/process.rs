//! Child processes that cannot outlive their test: [`ChildGuard`] sends SIGTERM to its PID on
//! drop (SIGKILL after a grace period), writes the child's stdout and stderr to a log file under
//! `<target>/testlogs/`, and reads that log's tail for error messages. On Linux the child also
//! gets `PR_SET_PDEATHSIG(SIGKILL)`, so a test binary killed by a timeout leaves no orphans.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::paths::{file_tail, testlog_dir};

/// How long [`ChildGuard::stop`] waits after SIGTERM before SIGKILL, unless changed.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// A running child process, stopped by PID when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
    log_path: PathBuf,
    grace: Duration,
    exit: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr going to `<target>/testlogs/<name>-.../<name>.log`.
    pub fn spawn(name: &str, cmd: Command) -> Result<Self> {
        let dir = testlog_dir(name)?;
        let log = dir.join(format!("{name}.log"));
        Self::spawn_logged(name, cmd, &log)
    }

    /// Spawns `cmd` with stdout and stderr appended to `log_path` (created if missing).
    pub fn spawn_logged(name: &str, mut cmd: Command, log_path: &Path) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| Error::io("open log", log_path, e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("dup log", log_path, e))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let program = PathBuf::from(cmd.get_program());
        let child =
            spawn_from_long_lived_thread(cmd).map_err(|source| Error::Spawn { program, source })?;
        Ok(ChildGuard {
            name: name.to_string(),
            child,
            log_path: log_path.to_path_buf(),
            grace: DEFAULT_GRACE,
            exit: None,
        })
    }

    /// The label given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file that receives the child's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        file_tail(&self.log_path, lines)
    }

    /// Changes the SIGTERM → SIGKILL grace period.
    pub fn set_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// The exit status if the child has exited (reaping it), else `None`.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
            }
        }
        self.exit
    }

    /// True while the child runs.
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// An [`Error::Exited`] if the child has exited, with the tail of its log.
    pub fn check_running(&mut self) -> Result<()> {
        match self.try_wait() {
            None => Ok(()),
            Some(status) => Err(Error::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                log: self.log_path.clone(),
                tail: self.log_tail(40),
            }),
        }
    }

    /// Stops the child: SIGTERM, wait up to the grace period, then SIGKILL; reaps it.
    /// Returns its exit status. Calling it again returns the same status.
    pub fn stop(&mut self) -> ExitStatus {
        if let Some(status) = self.try_wait() {
            return status;
        }
        send_signal(self.pid(), libc::SIGTERM);
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Grace period over: SIGKILL and reap (wait cannot block for long after SIGKILL).
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) => {
                self.exit = Some(status);
                status
            }
            // Only possible if someone else reaped it; report it as killed.
            Err(_) => {
                use std::os::unix::process::ExitStatusExt;
                let status = ExitStatus::from_raw(libc::SIGKILL);
                self.exit = Some(status);
                status
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// True if a process with this PID exists (and is not a zombie we could see as gone).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 {
        return false;
    }
    // A zombie still answers kill(0); treat it as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

fn send_signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: plain kill(2) on a PID we spawned and have not reaped yet.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns on one thread that lives as long as the process. `PR_SET_PDEATHSIG` fires when the
/// *thread* that forked the child exits, so forking from a test thread or a tokio blocking-pool
/// thread would kill the child too early; this thread never exits.
fn spawn_from_long_lived_thread(mut cmd: Command) -> std::io::Result<Child> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
        unsafe {
            let parent = libc::getpid();
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // If the thread cannot start, `rx` is dropped and every request fails below with a
        // clear error instead of a panic.
        let _ = std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    let sent = match spawner.lock() {
        Ok(tx) => tx.send((cmd, reply_tx)).is_ok(),
        Err(poisoned) => poisoned.into_inner().send((cmd, reply_tx)).is_ok(),
    };
    if !sent {
        return Err(std::io::Error::other(
            "testkit spawner thread is not running",
        ));
    }
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("testkit spawner thread dropped the request"))?
}
