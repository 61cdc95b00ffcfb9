//! The one error type of testkit: every failure names the file, binary, address or command it
//! concerns, so a red test says what to fix (often: which build command to run).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong while finding binaries, running processes or talking HTTP.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or binary the caller needs has not been built or installed.
    #[error("{what} not found at {path}: {hint}")]
    Missing {
        /// What was looked for ("Envoy binary", "filter .wasm", ...).
        what: String,
        /// Where it was looked for.
        path: PathBuf,
        /// The command that produces it.
        hint: String,
    },
    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("create dir", "write config", ...).
        action: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A child process could not be started.
    #[error("cannot spawn {program}: {source}")]
    Spawn {
        /// The program that was run.
        program: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A child process exited while it was expected to run (or to become ready).
    #[error("{name} exited early ({status}); last lines of {log}:\n{tail}")]
    Exited {
        /// Label of the process.
        name: String,
        /// Its exit status, as text.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of that log.
        tail: String,
    },
    /// A process did not become ready in time.
    #[error("{name} not ready after {waited_ms} ms ({reason}); last lines of {log}:\n{tail}")]
    NotReady {
        /// Label of the process.
        name: String,
        /// How long we waited.
        waited_ms: u128,
        /// The last thing that was not right.
        reason: String,
        /// Its log file.
        log: PathBuf,
        /// The end of that log.
        tail: String,
    },
    /// A command ran but failed (for example `envoy --mode validate`).
    #[error("{command} failed ({status}):\n{output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stdout and stderr.
        output: String,
    },
    /// An HTTP exchange failed.
    #[error("HTTP {method} http://{addr}{path}: {reason}")]
    Http {
        /// Request method.
        method: String,
        /// Peer address.
        addr: SocketAddr,
        /// Request path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// Serialising or parsing JSON / YAML failed.
    #[error("{what}: {reason}")]
    Format {
        /// What was being (de)serialised.
        what: String,
        /// The parser's message.
        reason: String,
    },
}

/// Result alias used throughout testkit.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
