//! The handful of `wasi_snapshot_preview1` imports a Rust `wasm32-wasip1` cdylib makes, written
//! here instead of pulling in `wasmtime-wasi`: stdout/stderr are captured, time comes from the
//! test's clock, randomness is seeded (runs repeat), and there is no file system. Any other WASI
//! import answers ENOSYS (see `vm.rs`).

use wasmtime::{Caller, Linker};

use crate::env::{read, write, write_u32, write_u64};
use crate::state::HostState;

type C<'a> = Caller<'a, HostState>;
type R = wasmtime::Result<u32>;

const MODULE: &str = "wasi_snapshot_preview1";
const ESUCCESS: u32 = 0;
const EBADF: u32 = 8;
const EINVAL: u32 = 28;
const ESPIPE: u32 = 70;
/// Returned by every WASI function this host does not offer.
pub const ENOSYS: u32 = 52;

/// The error a module gets when it calls `proc_exit`, so the test sees the exit code.
#[derive(Debug, thiserror::Error)]
#[error("module called proc_exit({0})")]
pub struct ProcExit(pub u32);

fn fd_write(mut c: C<'_>, fd: u32, iovs: u32, iovs_len: u32, nwritten: u32) -> R {
    let mut out = Vec::new();
    for i in 0..iovs_len {
        let iov = read(&c, iovs.wrapping_add(i * 8), 8)?;
        let ptr = u32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
        let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
        out.extend_from_slice(&read(&c, ptr, len)?);
    }
    let n = u32::try_from(out.len()).unwrap_or(u32::MAX);
    let st = c.data_mut();
    st.host_calls += 1;
    let text = String::from_utf8_lossy(&out).into_owned();
    if st.passthrough_output && (fd == 1 || fd == 2) {
        use std::io::Write;
        let _ = if fd == 1 {
            std::io::stdout().write_all(&out)
        } else {
            std::io::stderr().write_all(&out)
        };
        write_u32(&mut c, nwritten, n)?;
        return Ok(ESUCCESS);
    }
    let errno = match fd {
        1 => {
            st.trace
                .push(|| format!("[vm->host] fd_write(stdout, {text:?})"));
            st.stdout.extend_from_slice(&out);
            ESUCCESS
        }
        2 => {
            st.trace
                .push(|| format!("[vm->host] fd_write(stderr, {text:?})"));
            st.stderr.extend_from_slice(&out);
            ESUCCESS
        }
        _ => EBADF,
    };
    if errno == ESUCCESS {
        write_u32(&mut c, nwritten, n)?;
    }
    Ok(errno)
}

/// `args_sizes_get` / `environ_sizes_get`: how many strings, and their bytes with NULs.
fn sizes_of(mut c: C<'_>, strings: &[Vec<u8>], count: u32, size: u32) -> R {
    let n = u32::try_from(strings.len()).unwrap_or(u32::MAX);
    let bytes =
        u32::try_from(strings.iter().map(|a| a.len() + 1).sum::<usize>()).unwrap_or(u32::MAX);
    write_u32(&mut c, count, n)?;
    write_u32(&mut c, size, bytes)?;
    Ok(ESUCCESS)
}

/// `args_get` / `environ_get`: the pointer table at `table`, the NUL-terminated strings at `buf`.
fn strings_get(mut c: C<'_>, strings: &[Vec<u8>], table: u32, buf: u32) -> R {
    let mut at = buf;
    for (i, a) in strings.iter().enumerate() {
        let slot = table.wrapping_add(u32::try_from(4 * i).unwrap_or(u32::MAX));
        write_u32(&mut c, slot, at)?;
        let mut z = a.clone();
        z.push(0);
        write(&mut c, at, &z)?;
        at = at.wrapping_add(u32::try_from(z.len()).unwrap_or(u32::MAX));
    }
    Ok(ESUCCESS)
}

fn args_sizes_get(mut c: C<'_>, count: u32, size: u32) -> R {
    let args = &c.data().args;
    let n = u32::try_from(args.len()).unwrap_or(u32::MAX);
    let bytes = u32::try_from(args.iter().map(|a| a.len() + 1).sum::<usize>()).unwrap_or(u32::MAX);
    write_u32(&mut c, count, n)?;
    write_u32(&mut c, size, bytes)?;
    Ok(ESUCCESS)
}

fn args_get(mut c: C<'_>, argv: u32, buf: u32) -> R {
    let args = c.data().args.clone();
    let mut at = buf;
    for (i, a) in args.iter().enumerate() {
        let slot = argv.wrapping_add(u32::try_from(4 * i).unwrap_or(u32::MAX));
        write_u32(&mut c, slot, at)?;
        let mut z = a.clone();
        z.push(0);
        write(&mut c, at, &z)?;
        at = at.wrapping_add(u32::try_from(z.len()).unwrap_or(u32::MAX));
    }
    Ok(ESUCCESS)
}

/// Defines the WASI functions this host offers; returns their names.
pub(crate) fn define(linker: &mut Linker<HostState>) -> wasmtime::Result<Vec<&'static str>> {
    let mut names = Vec::new();
    macro_rules! def {
        ($name:literal, $f:expr) => {
            linker.func_wrap(MODULE, $name, $f)?;
            names.push($name);
        };
    }
    def!("fd_write", fd_write);
    def!("fd_read", |mut c: C<'_>,
                     fd: u32,
                     _iovs: u32,
                     _len: u32,
                     nread: u32|
     -> R {
        if fd == 0 {
            write_u32(&mut c, nread, 0)?;
            return Ok(ESUCCESS);
        }
        Ok(EBADF)
    });
    def!("fd_close", |_c: C<'_>, _fd: u32| -> R { Ok(ESUCCESS) });
    def!("fd_seek", |_c: C<'_>,
                     _fd: u32,
                     _off: i64,
                     _whence: u32,
                     _out: u32|
     -> R { Ok(ESPIPE) });
    def!("fd_sync", |_c: C<'_>, _fd: u32| -> R { Ok(ESUCCESS) });
    def!("fd_fdstat_get", |mut c: C<'_>, fd: u32, out: u32| -> R {
        if fd > 2 {
            return Ok(EBADF);
        }
        // filetype CHARACTER_DEVICE (2), no flags, all rights.
        let mut stat = [0u8; 24];
        stat[0] = 2;
        stat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        stat[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        write(&mut c, out, &stat)?;
        Ok(ESUCCESS)
    });
    def!("fd_prestat_get", |_c: C<'_>, _fd: u32, _out: u32| -> R {
        Ok(EBADF)
    });
    def!("fd_prestat_dir_name", |_c: C<'_>,
                                 _fd: u32,
                                 _p: u32,
                                 _l: u32|
     -> R { Ok(EBADF) });
    def!("environ_sizes_get", |c: C<'_>,
                               count: u32,
                               size: u32|
     -> R {
        let env = c.data().env.clone();
        sizes_of(c, &env, count, size)
    });
    def!("environ_get", |c: C<'_>, table: u32, buf: u32| -> R {
        let env = c.data().env.clone();
        strings_get(c, &env, table, buf)
    });
    def!("args_sizes_get", args_sizes_get);
    def!("args_get", args_get);
    def!("clock_time_get", |mut c: C<'_>,
                            id: u32,
                            _precision: i64,
                            out: u32|
     -> R {
        if id > 3 {
            return Ok(EINVAL);
        }
        let now = c.data().now_ns();
        write_u64(&mut c, out, now)?;
        Ok(ESUCCESS)
    });
    def!("clock_res_get", |mut c: C<'_>, _id: u32, out: u32| -> R {
        write_u64(&mut c, out, 1)?;
        Ok(ESUCCESS)
    });
    def!("random_get", |mut c: C<'_>, buf: u32, len: u32| -> R {
        let mut bytes = Vec::with_capacity(len as usize + 8);
        while bytes.len() < len as usize {
            let r = c.data_mut().next_random();
            bytes.extend_from_slice(&r.to_le_bytes());
        }
        bytes.truncate(len as usize);
        write(&mut c, buf, &bytes)?;
        Ok(ESUCCESS)
    });
    def!("sched_yield", |_c: C<'_>| -> R { Ok(ESUCCESS) });
    def!("proc_exit", |_c: C<'_>,
                       code: u32|
     -> wasmtime::Result<()> {
        Err(wasmtime::Error::new(ProcExit(code)))
    });
    Ok(names)
}

/// The WASI module name.
pub(crate) const WASI_MODULE: &str = MODULE;
