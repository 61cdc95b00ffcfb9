//! The `env` imports of the proxy-wasm ABI 0.2.1: every function a module built with the Rust SDK
//! 0.2.5 imports, answering with exactly the statuses Envoy answers (and the SDK accepts), and
//! writing a `[vm->host]` trace line per call.

use wasmtime::{Caller, Linker};

use crate::abi::{
    decode_pairs, encode_pairs, path_to_dotted, BufferType, LogLevel, MapType, MetricType, Pairs,
    Status, StreamType,
};
use crate::state::{
    lock, ForeignCall, HostState, HttpCall, LocalResponse, LogEntry, Metric, Queue,
};

type C<'a> = Caller<'a, HostState>;
type R = wasmtime::Result<u32>;

const OK: u32 = Status::Ok as u32;
const NOT_FOUND: u32 = Status::NotFound as u32;
const BAD_ARGUMENT: u32 = Status::BadArgument as u32;

// ---------- memory helpers ----------

fn memory(c: &C<'_>) -> wasmtime::Result<wasmtime::Memory> {
    c.data()
        .memory
        .ok_or_else(|| wasmtime::Error::msg("module exports no memory"))
}

/// Copies `len` bytes at `ptr` out of the module.
pub(crate) fn read(c: &C<'_>, ptr: u32, len: u32) -> wasmtime::Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let counted = &c.data().pending_in;
    counted.set(counted.get().saturating_add(u64::from(len)));
    let mem = memory(c)?;
    let (p, l) = (ptr as usize, len as usize);
    mem.data(c)
        .get(p..p.saturating_add(l))
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            wasmtime::Error::msg(format!("out-of-bounds read of {len} bytes at {ptr:#x}"))
        })
}

fn read_string(c: &C<'_>, ptr: u32, len: u32) -> wasmtime::Result<String> {
    Ok(String::from_utf8_lossy(&read(c, ptr, len)?).into_owned())
}

pub(crate) fn write(c: &mut C<'_>, ptr: u32, bytes: &[u8]) -> wasmtime::Result<()> {
    let mem = memory(c)?;
    let p = ptr as usize;
    let dst = mem
        .data_mut(&mut *c)
        .get_mut(p..p.saturating_add(bytes.len()))
        .ok_or_else(|| {
            wasmtime::Error::msg(format!(
                "out-of-bounds write of {} bytes at {ptr:#x}",
                bytes.len()
            ))
        })?;
    dst.copy_from_slice(bytes);
    Ok(())
}

pub(crate) fn write_u32(c: &mut C<'_>, ptr: u32, v: u32) -> wasmtime::Result<()> {
    write(c, ptr, &v.to_le_bytes())
}

pub(crate) fn write_u64(c: &mut C<'_>, ptr: u32, v: u64) -> wasmtime::Result<()> {
    write(c, ptr, &v.to_le_bytes())
}

/// Hands bytes to the module the way Envoy does: allocate with the module's
/// `proxy_on_memory_allocate`, copy, and store pointer and size; nothing is allocated for
/// empty data (pointer 0, size 0).
fn give(c: &mut C<'_>, bytes: &[u8], ptr_ptr: u32, size_ptr: u32) -> wasmtime::Result<()> {
    let mut ptr = 0;
    if !bytes.is_empty() {
        let alloc = c.data().alloc.clone().ok_or_else(|| {
            wasmtime::Error::msg("module exports no proxy_on_memory_allocate/malloc")
        })?;
        let len = u32::try_from(bytes.len())
            .map_err(|_| wasmtime::Error::msg("value too large for wasm32"))?;
        ptr = alloc.call(&mut *c, len)?;
        c.data_mut().count_allocation();
        if ptr == 0 {
            return Err(wasmtime::Error::msg(format!(
                "module failed to allocate {len} bytes"
            )));
        }
        write(c, ptr, bytes)?;
        c.data_mut().count_out(bytes.len());
    }
    write_u32(c, ptr_ptr, ptr)?;
    write_u32(c, size_ptr, u32::try_from(bytes.len()).unwrap_or(u32::MAX))
}

fn trace(c: &mut C<'_>, line: impl FnOnce() -> String) {
    let st = c.data_mut();
    if st.call_counts.is_some() {
        let line = line();
        st.count_call(&line);
        st.trace.push(|| format!("[vm->host] {line}"));
    } else {
        st.count_call("");
        st.trace.push(|| format!("[vm->host] {}", line()));
    }
}

fn status_name(s: u32) -> &'static str {
    match s {
        0 => "Ok",
        1 => "NotFound",
        2 => "BadArgument",
        3 => "SerializationFailure",
        4 => "ParseFailure",
        7 => "Empty",
        8 => "CasMismatch",
        10 => "InternalFailure",
        12 => "Unimplemented",
        _ => "?",
    }
}

fn show(bytes: &[u8]) -> String {
    const MAX: usize = 96;
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]).into_owned();
    if bytes.len() > MAX {
        format!("{s:?}...({} bytes)", bytes.len())
    } else {
        format!("{s:?}")
    }
}

// ---------- header maps ----------

fn map_ref(st: &mut HostState, mt: MapType) -> Option<&mut Pairs> {
    let ctx = st.effective_ctx;
    match mt {
        MapType::HttpCallResponseHeaders => st.call_response.as_mut().map(|r| &mut r.0),
        MapType::HttpCallResponseTrailers => st.call_response.as_mut().map(|r| &mut r.2),
        MapType::GrpcInitialMetadata | MapType::GrpcTrailingMetadata => None,
        _ => {
            let s = st.streams.get_mut(&ctx)?;
            match mt {
                MapType::RequestHeaders => s.request_headers.as_mut(),
                MapType::RequestTrailers => {
                    // Envoy lets a filter add trailers while it holds the last body chunk.
                    if s.request_trailers.is_none() && s.request_body_eos {
                        s.request_trailers = Some(Vec::new());
                    }
                    s.request_trailers.as_mut()
                }
                MapType::ResponseHeaders => s.response_headers.as_mut(),
                MapType::ResponseTrailers => {
                    if s.response_trailers.is_none() && s.response_body_eos {
                        s.response_trailers = Some(Vec::new());
                    }
                    s.response_trailers.as_mut()
                }
                _ => None,
            }
        }
    }
}

/// Notes an edit of a map whose contents already left the proxy (Envoy ignores it).
fn check_late_edit(st: &mut HostState, mt: MapType, what: &str) {
    let ctx = st.effective_ctx;
    let late = match st.streams.get(&ctx) {
        Some(s) => match mt {
            MapType::RequestHeaders => s.request_headers_sent,
            MapType::ResponseHeaders => s.response_headers_sent,
            _ => false,
        },
        None => false,
    };
    if late {
        st.violation(format!(
            "{what} on {mt:?} after they were sent on: Envoy would not forward this change"
        ));
    }
}

fn get_header_map_pairs(mut c: C<'_>, mt: u32, ptr_ptr: u32, size_ptr: u32) -> R {
    let Some(map) = MapType::from_raw(mt) else {
        trace(&mut c, || {
            format!("proxy_get_header_map_pairs(map={mt}) -> BadArgument")
        });
        return Ok(BAD_ARGUMENT);
    };
    let bytes = map_ref(c.data_mut(), map).map(|p| encode_pairs(p));
    let Some(bytes) = bytes else {
        trace(&mut c, || {
            format!("proxy_get_header_map_pairs({map:?}) -> BadArgument (no such map now)")
        });
        return Ok(BAD_ARGUMENT);
    };
    trace(&mut c, || {
        format!(
            "proxy_get_header_map_pairs({map:?}) -> Ok ({} bytes)",
            bytes.len()
        )
    });
    give(&mut c, &bytes, ptr_ptr, size_ptr)?;
    Ok(OK)
}

fn set_header_map_pairs(mut c: C<'_>, mt: u32, ptr: u32, size: u32) -> R {
    let data = read(&c, ptr, size)?;
    let Some(map) = MapType::from_raw(mt) else {
        return Ok(BAD_ARGUMENT);
    };
    let pairs = match decode_pairs(&data) {
        Ok(p) => p,
        Err(e) => {
            trace(&mut c, || {
                format!("proxy_set_header_map_pairs({map:?}) -> BadArgument ({e})")
            });
            return Ok(BAD_ARGUMENT);
        }
    };
    check_late_edit(c.data_mut(), map, "set_header_map_pairs");
    let n = pairs.len();
    let status = match map_ref(c.data_mut(), map) {
        Some(m) => {
            *m = pairs;
            OK
        }
        None => BAD_ARGUMENT,
    };
    trace(&mut c, || {
        format!(
            "proxy_set_header_map_pairs({map:?}, {n} pairs) -> {}",
            status_name(status)
        )
    });
    Ok(status)
}

fn get_header_map_value(mut c: C<'_>, mt: u32, kp: u32, kl: u32, ptr_ptr: u32, size_ptr: u32) -> R {
    let key = read_string(&c, kp, kl)?.to_ascii_lowercase();
    let Some(map) = MapType::from_raw(mt) else {
        return Ok(BAD_ARGUMENT);
    };
    let found = match map_ref(c.data_mut(), map) {
        None => {
            trace(&mut c, || {
                format!(
                    "proxy_get_header_map_value({map:?}, {key:?}) -> BadArgument (no such map now)"
                )
            });
            return Ok(BAD_ARGUMENT);
        }
        Some(m) => m.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()),
    };
    match found {
        Some(v) => {
            trace(&mut c, || {
                format!(
                    "proxy_get_header_map_value({map:?}, {key:?}) -> Ok {}",
                    show(&v)
                )
            });
            give(&mut c, &v, ptr_ptr, size_ptr)?;
            Ok(OK)
        }
        None => {
            trace(&mut c, || {
                format!("proxy_get_header_map_value({map:?}, {key:?}) -> NotFound")
            });
            Ok(NOT_FOUND)
        }
    }
}

fn edit_map(mut c: C<'_>, mt: u32, key: String, value: Option<Vec<u8>>, op: &'static str) -> R {
    let key = key.to_ascii_lowercase();
    let Some(map) = MapType::from_raw(mt) else {
        return Ok(BAD_ARGUMENT);
    };
    check_late_edit(c.data_mut(), map, &format!("{op} {key:?}"));
    let status = match map_ref(c.data_mut(), map) {
        None => BAD_ARGUMENT,
        Some(m) => {
            match (op, value.clone()) {
                ("add", Some(v)) => m.push((key.clone(), v)),
                ("replace", Some(v)) => {
                    // Envoy's setCopy: the first entry keeps its place, duplicates go.
                    match m.iter().position(|(k, _)| *k == key) {
                        Some(i) => {
                            m[i].1 = v;
                            let mut seen = false;
                            m.retain(|(k, _)| {
                                if *k != key {
                                    return true;
                                }
                                let keep = !seen;
                                seen = true;
                                keep
                            });
                        }
                        None => m.push((key.clone(), v)),
                    }
                }
                _ => m.retain(|(k, _)| *k != key),
            }
            OK
        }
    };
    trace(&mut c, || {
        let v = value
            .as_deref()
            .map(|v| format!(", {}", show(v)))
            .unwrap_or_default();
        format!(
            "proxy_{op}_header_map_value({map:?}, {key:?}{v}) -> {}",
            status_name(status)
        )
    });
    Ok(status)
}

// ---------- buffers ----------

fn buffer_of(st: &HostState, bt: BufferType) -> Option<Vec<u8>> {
    let ctx = st.effective_ctx;
    match bt {
        BufferType::RequestBody => st.streams.get(&ctx)?.request_body.clone(),
        BufferType::ResponseBody => st.streams.get(&ctx)?.response_body.clone(),
        BufferType::VmConfiguration => st.in_vm_start.then(|| st.vm_config.clone()),
        BufferType::PluginConfiguration => st.in_configure.then(|| st.plugin_config.clone()),
        BufferType::HttpCallResponseBody => st.call_response.as_ref().map(|r| r.1.clone()),
        _ => None,
    }
}

fn get_buffer_bytes(mut c: C<'_>, bt: u32, start: u32, max: u32, ptr_ptr: u32, size_ptr: u32) -> R {
    let Some(buf) = BufferType::from_raw(bt) else {
        return Ok(BAD_ARGUMENT);
    };
    let Some(data) = buffer_of(c.data(), buf) else {
        trace(&mut c, || {
            format!("proxy_get_buffer_bytes({buf:?}, start={start}, max={max}) -> NotFound")
        });
        return Ok(NOT_FOUND);
    };
    let start = start as usize;
    let end = start.saturating_add(max as usize).min(data.len());
    let slice = data.get(start..end).unwrap_or(&[]);
    trace(&mut c, || {
        format!(
            "proxy_get_buffer_bytes({buf:?}, start={start}, max={max}) -> Ok ({} of {} bytes)",
            slice.len(),
            data.len()
        )
    });
    if !slice.is_empty() {
        give(&mut c, slice, ptr_ptr, size_ptr)?;
    }
    Ok(OK)
}

fn set_buffer_bytes(mut c: C<'_>, bt: u32, start: u32, size: u32, ptr: u32, len: u32) -> R {
    let data = read(&c, ptr, len)?;
    let Some(buf) = BufferType::from_raw(bt) else {
        return Ok(BAD_ARGUMENT);
    };
    let ctx = c.data().effective_ctx;
    let st = c.data_mut();
    let target = match (buf, st.streams.get_mut(&ctx)) {
        (BufferType::RequestBody, Some(s)) => s.request_body.as_mut(),
        (BufferType::ResponseBody, Some(s)) => s.response_body.as_mut(),
        _ => None,
    };
    // Envoy's Buffer::copyFrom: start 0 drains `size` bytes and prepends; start at or past the
    // end appends; anything else is BadArgument.
    let status = match target {
        None => NOT_FOUND,
        Some(b) => {
            let (start, size) = (start as usize, size as usize);
            if start == 0 {
                let drain = size.min(b.len());
                b.drain(..drain);
                b.splice(0..0, data.iter().copied());
                OK
            } else if start >= b.len() {
                b.extend_from_slice(&data);
                OK
            } else {
                BAD_ARGUMENT
            }
        }
    };
    trace(&mut c, || {
        format!(
            "proxy_set_buffer_bytes({buf:?}, start={start}, size={size}, {}) -> {}",
            show(&data),
            status_name(status)
        )
    });
    Ok(status)
}

// ---------- properties ----------

fn derived_property(st: &HostState, path: &str) -> Option<Vec<u8>> {
    let s = st.streams.get(&st.effective_ctx);
    let req = |name: &str| -> Option<Vec<u8>> {
        let h = s?.request_headers.as_ref()?;
        h.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    };
    match path {
        "plugin_name" | "plugin_root_id" => Some(st.root_id.as_bytes().to_vec()),
        "plugin_vm_id" => Some(st.vm_id.as_bytes().to_vec()),
        "request.path" => req(":path"),
        "request.url_path" => {
            req(":path").map(|p| p.split(|b| *b == b'?').next().unwrap_or(&[]).to_vec())
        }
        "request.method" => req(":method"),
        "request.host" => req(":authority"),
        "request.scheme" => req(":scheme"),
        "request.id" => req("x-request-id"),
        "response.code" => {
            let h = s?.response_headers.as_ref()?;
            let code = h.iter().find(|(k, _)| k == ":status")?;
            let code: i64 = std::str::from_utf8(&code.1).ok()?.parse().ok()?;
            Some(code.to_le_bytes().to_vec())
        }
        _ => {
            let name = path.strip_prefix("request.headers.")?;
            req(name)
        }
    }
}

fn get_property(mut c: C<'_>, pp: u32, pl: u32, ptr_ptr: u32, size_ptr: u32) -> R {
    let path = path_to_dotted(&read(&c, pp, pl)?);
    let st = c.data();
    let value = st
        .streams
        .get(&st.effective_ctx)
        .and_then(|s| s.properties.get(&path).cloned())
        .or_else(|| st.properties.get(&path).cloned())
        .or_else(|| derived_property(st, &path));
    match value {
        Some(v) => {
            trace(&mut c, || {
                format!("proxy_get_property({path:?}) -> Ok {}", show(&v))
            });
            give(&mut c, &v, ptr_ptr, size_ptr)?;
            Ok(OK)
        }
        None => {
            trace(&mut c, || {
                format!("proxy_get_property({path:?}) -> NotFound")
            });
            Ok(NOT_FOUND)
        }
    }
}

fn set_property(mut c: C<'_>, pp: u32, pl: u32, vp: u32, vl: u32) -> R {
    let path = path_to_dotted(&read(&c, pp, pl)?);
    let value = read(&c, vp, vl)?;
    trace(&mut c, || {
        format!("proxy_set_property({path:?}, {}) -> Ok", show(&value))
    });
    let st = c.data_mut();
    let ctx = st.effective_ctx;
    match st.streams.get_mut(&ctx) {
        Some(s) => s.properties.insert(path, value),
        None => st.properties.insert(path, value),
    };
    Ok(OK)
}

// ---------- shared data and queues ----------

fn get_shared_data(mut c: C<'_>, kp: u32, kl: u32, ptr_ptr: u32, size_ptr: u32, cas_ptr: u32) -> R {
    let key = read_string(&c, kp, kl)?;
    let vm_id = c.data().vm_id.clone();
    let found = lock(&c.data().shared)
        .data
        .get(&(vm_id, key.clone()))
        .cloned();
    match found {
        Some((value, cas)) => {
            trace(&mut c, || {
                format!(
                    "proxy_get_shared_data({key:?}) -> Ok ({} bytes, cas={cas})",
                    value.len()
                )
            });
            give(&mut c, &value, ptr_ptr, size_ptr)?;
            write_u32(&mut c, cas_ptr, cas)?;
            Ok(OK)
        }
        None => {
            trace(&mut c, || {
                format!("proxy_get_shared_data({key:?}) -> NotFound")
            });
            Ok(NOT_FOUND)
        }
    }
}

fn set_shared_data(mut c: C<'_>, kp: u32, kl: u32, vp: u32, vl: u32, cas: u32) -> R {
    let key = read_string(&c, kp, kl)?;
    let value = read(&c, vp, vl)?;
    let vm_id = c.data().vm_id.clone();
    let (status, new_cas) = {
        let mut sh = lock(&c.data().shared);
        let current = sh
            .data
            .get(&(vm_id.clone(), key.clone()))
            .map(|(_, cas)| *cas);
        match current {
            Some(cur) if cas != 0 && cas != cur => (Status::CasMismatch as u32, cur),
            _ => {
                let next = sh.next_cas();
                sh.data.insert((vm_id, key.clone()), (value.clone(), next));
                (OK, next)
            }
        }
    };
    trace(&mut c, || {
        format!(
            "proxy_set_shared_data({key:?}, {} bytes, cas={cas}) -> {} (cas now {new_cas})",
            value.len(),
            status_name(status)
        )
    });
    Ok(status)
}

fn register_shared_queue(mut c: C<'_>, np: u32, nl: u32, id_ptr: u32) -> R {
    let name = read_string(&c, np, nl)?;
    let (vm_id, vm, ctx) = (
        c.data().vm_id.clone(),
        c.data().vm_index,
        c.data().effective_ctx,
    );
    let id = {
        let mut sh = lock(&c.data().shared);
        match sh
            .queues
            .iter()
            .position(|q| q.vm_id == vm_id && q.name == name)
        {
            Some(i) => {
                let q = &mut sh.queues[i];
                q.owner_vm = vm;
                q.owner_ctx = ctx;
                i + 1
            }
            None => {
                sh.queues.push(Queue {
                    vm_id,
                    name: name.clone(),
                    owner_vm: vm,
                    owner_ctx: ctx,
                    items: Default::default(),
                    unannounced: 0,
                });
                sh.queues.len()
            }
        }
    };
    let id = u32::try_from(id).unwrap_or(u32::MAX);
    trace(&mut c, || {
        format!("proxy_register_shared_queue({name:?}) -> Ok id={id}")
    });
    write_u32(&mut c, id_ptr, id)?;
    Ok(OK)
}

fn resolve_shared_queue(mut c: C<'_>, vp: u32, vl: u32, np: u32, nl: u32, id_ptr: u32) -> R {
    let vm_id = read_string(&c, vp, vl)?;
    let name = read_string(&c, np, nl)?;
    let vm_id = if vm_id.is_empty() {
        c.data().vm_id.clone()
    } else {
        vm_id
    };
    let found = lock(&c.data().shared)
        .queues
        .iter()
        .position(|q| q.vm_id == vm_id && q.name == name);
    trace(&mut c, || {
        format!("proxy_resolve_shared_queue({vm_id:?}, {name:?}) -> {found:?}")
    });
    match found {
        Some(i) => {
            write_u32(&mut c, id_ptr, u32::try_from(i + 1).unwrap_or(u32::MAX))?;
            Ok(OK)
        }
        None => Ok(NOT_FOUND),
    }
}

fn dequeue_shared_queue(mut c: C<'_>, id: u32, ptr_ptr: u32, size_ptr: u32) -> R {
    let item = {
        let mut sh = lock(&c.data().shared);
        match sh.queues.get_mut((id as usize).wrapping_sub(1)) {
            None => Err(NOT_FOUND),
            Some(q) => q.items.pop_front().ok_or(Status::Empty as u32),
        }
    };
    match item {
        Ok(v) => {
            trace(&mut c, || {
                format!("proxy_dequeue_shared_queue({id}) -> Ok {}", show(&v))
            });
            give(&mut c, &v, ptr_ptr, size_ptr)?;
            Ok(OK)
        }
        Err(s) => {
            trace(&mut c, || {
                format!("proxy_dequeue_shared_queue({id}) -> {}", status_name(s))
            });
            Ok(s)
        }
    }
}

fn enqueue_shared_queue(mut c: C<'_>, id: u32, vp: u32, vl: u32) -> R {
    let value = read(&c, vp, vl)?;
    let status = {
        let mut sh = lock(&c.data().shared);
        match sh.queues.get_mut((id as usize).wrapping_sub(1)) {
            None => NOT_FOUND,
            Some(q) => {
                q.items.push_back(value.clone());
                q.unannounced += 1;
                OK
            }
        }
    };
    trace(&mut c, || {
        format!(
            "proxy_enqueue_shared_queue({id}, {}) -> {}",
            show(&value),
            status_name(status)
        )
    });
    Ok(status)
}

// ---------- stream control ----------

fn continue_stream(mut c: C<'_>, stream: u32) -> R {
    let st = c.data_mut();
    let ctx = st.effective_ctx;
    let which = StreamType::from_raw(stream);
    let status = match (which, st.streams.get_mut(&ctx)) {
        (Some(StreamType::Request), Some(s)) => {
            s.resume_request = true;
            OK
        }
        (Some(StreamType::Response), Some(s)) => {
            s.resume_response = true;
            OK
        }
        (Some(_), None) => NOT_FOUND,
        _ => BAD_ARGUMENT,
    };
    trace(&mut c, || {
        format!(
            "proxy_continue_stream({which:?}) -> {}",
            status_name(status)
        )
    });
    Ok(status)
}

fn close_stream(mut c: C<'_>, stream: u32) -> R {
    let st = c.data_mut();
    let ctx = st.effective_ctx;
    let which = StreamType::from_raw(stream);
    let status = match (which, st.streams.get_mut(&ctx)) {
        (Some(_), Some(s)) => {
            s.reset = true;
            OK
        }
        (Some(_), None) => NOT_FOUND,
        _ => BAD_ARGUMENT,
    };
    trace(&mut c, || {
        format!("proxy_close_stream({which:?}) -> {}", status_name(status))
    });
    Ok(status)
}

#[allow(clippy::too_many_arguments)]
fn send_local_response(
    mut c: C<'_>,
    code: u32,
    dp: u32,
    dl: u32,
    bp: u32,
    bl: u32,
    hp: u32,
    hl: u32,
    grpc: i32,
) -> R {
    let details = read_string(&c, dp, dl)?;
    let body = read(&c, bp, bl)?;
    let headers = match decode_pairs(&read(&c, hp, hl)?) {
        Ok(p) => p,
        Err(e) => {
            trace(&mut c, || {
                format!("proxy_send_local_response({code}) -> BadArgument ({e})")
            });
            return Ok(BAD_ARGUMENT);
        }
    };
    let headers: Vec<(String, String)> = headers
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let lr = LocalResponse {
        status: code,
        details,
        body,
        headers,
        grpc_status: grpc,
    };
    let summary = format!(
        "proxy_send_local_response({code}, headers={:?}, body={})",
        lr.headers,
        show(&lr.body)
    );
    let st = c.data_mut();
    let ctx = st.effective_ctx;
    let status = match st.streams.get_mut(&ctx) {
        None => BAD_ARGUMENT,
        Some(s) => {
            if let Some(first) = &s.local_response {
                let what = format!(
                    "second proxy_send_local_response ({code}) after {}: Envoy keeps only the first",
                    first.status
                );
                s.violations.push(what);
            } else {
                s.local_response = Some(lr);
            }
            OK
        }
    };
    trace(&mut c, || format!("{summary} -> {}", status_name(status)));
    Ok(status)
}

// ---------- http / grpc calls ----------

#[allow(clippy::too_many_arguments)]
fn http_call(
    mut c: C<'_>,
    up: u32,
    ul: u32,
    hp: u32,
    hl: u32,
    bp: u32,
    bl: u32,
    tp: u32,
    tl: u32,
    timeout: u32,
    token_ptr: u32,
) -> R {
    let upstream = read_string(&c, up, ul)?;
    let to_strings = |p: Pairs| {
        p.into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect()
    };
    let (Ok(headers), Ok(trailers)) = (
        decode_pairs(&read(&c, hp, hl)?),
        decode_pairs(&read(&c, tp, tl)?),
    ) else {
        trace(&mut c, || {
            format!("proxy_http_call({upstream:?}) -> BadArgument (bad header map)")
        });
        return Ok(BAD_ARGUMENT);
    };
    let body = read(&c, bp, bl)?;
    let st = c.data_mut();
    st.next_token += 1;
    let token = st.next_token;
    let call = HttpCall {
        token,
        ctx: st.effective_ctx,
        upstream,
        headers: to_strings(headers),
        body,
        trailers: to_strings(trailers),
        timeout_ms: timeout,
    };
    let line = format!(
        "proxy_http_call({:?}, headers={:?}, timeout={timeout}ms) -> Ok token={token}",
        call.upstream, call.headers
    );
    st.http_calls.push(call);
    trace(&mut c, || line);
    write_u32(&mut c, token_ptr, token)?;
    Ok(OK)
}

// ---------- metrics ----------

fn metric_name(st: &HostState, id: u32) -> Option<(String, MetricType)> {
    st.metric_ids.get((id as usize).wrapping_sub(1)).cloned()
}

fn define_metric(mut c: C<'_>, kind: u32, np: u32, nl: u32, id_ptr: u32) -> R {
    let name = read_string(&c, np, nl)?;
    let Some(kind) = MetricType::from_raw(kind) else {
        trace(&mut c, || {
            format!("proxy_define_metric({kind}, {name:?}) -> BadArgument")
        });
        return Ok(BAD_ARGUMENT);
    };
    let st = c.data_mut();
    lock(&st.shared)
        .metrics
        .entry(name.clone())
        .or_insert(Metric {
            kind,
            value: 0,
            samples: Vec::new(),
        });
    st.metric_ids.push((name.clone(), kind));
    let id = u32::try_from(st.metric_ids.len()).unwrap_or(u32::MAX);
    trace(&mut c, || {
        format!("proxy_define_metric({kind:?}, {name:?}) -> Ok id={id}")
    });
    write_u32(&mut c, id_ptr, id)?;
    Ok(OK)
}

fn with_metric(c: &mut C<'_>, id: u32, f: impl FnOnce(&mut Metric) -> u32) -> (u32, String) {
    let st = c.data();
    let Some((name, _)) = metric_name(st, id) else {
        return (NOT_FOUND, format!("#{id}"));
    };
    let mut sh = lock(&st.shared);
    let status = match sh.metrics.get_mut(&name) {
        Some(m) => f(m),
        None => NOT_FOUND,
    };
    (status, name)
}

fn increment_metric(mut c: C<'_>, id: u32, offset: i64) -> R {
    // Envoy: counters only go up; histograms cannot be incremented.
    let (status, name) = with_metric(&mut c, id, |m| match m.kind {
        MetricType::Counter if offset > 0 => {
            m.value = m.value.saturating_add(offset);
            OK
        }
        MetricType::Gauge => {
            m.value = m.value.saturating_add(offset);
            OK
        }
        _ => BAD_ARGUMENT,
    });
    trace(&mut c, || {
        format!(
            "proxy_increment_metric({name:?}, {offset}) -> {}",
            status_name(status)
        )
    });
    Ok(status)
}

fn record_metric(mut c: C<'_>, id: u32, value: u64) -> R {
    let (status, name) = with_metric(&mut c, id, |m| {
        match m.kind {
            MetricType::Counter => {
                m.value = m
                    .value
                    .saturating_add(i64::try_from(value).unwrap_or(i64::MAX))
            }
            MetricType::Gauge => m.value = i64::try_from(value).unwrap_or(i64::MAX),
            MetricType::Histogram => m.samples.push(value),
        }
        OK
    });
    trace(&mut c, || {
        format!(
            "proxy_record_metric({name:?}, {value}) -> {}",
            status_name(status)
        )
    });
    Ok(status)
}

fn get_metric(mut c: C<'_>, id: u32, ptr: u32) -> R {
    let mut out = 0u64;
    let (status, name) = with_metric(&mut c, id, |m| match m.kind {
        MetricType::Histogram => BAD_ARGUMENT,
        _ => {
            out = m.value as u64;
            OK
        }
    });
    trace(&mut c, || {
        format!(
            "proxy_get_metric({name:?}) -> {} {out}",
            status_name(status)
        )
    });
    if status == OK {
        write_u64(&mut c, ptr, out)?;
    }
    Ok(status)
}

// ---------- misc ----------

fn log(mut c: C<'_>, level: u32, ptr: u32, len: u32) -> R {
    let message = read_string(&c, ptr, len)?;
    let level = LogLevel::from_raw(level).unwrap_or(LogLevel::Critical);
    let st = c.data_mut();
    let ctx = st.effective_ctx;
    st.trace
        .push(|| format!("[vm->host] proxy_log({level:?}, {message:?})"));
    st.count_call("proxy_log");
    st.logs.push(LogEntry {
        ctx,
        level,
        message,
    });
    Ok(OK)
}

fn call_foreign_function(mut c: C<'_>, np: u32, nl: u32, ap: u32, al: u32, rp: u32, rl: u32) -> R {
    let name = read_string(&c, np, nl)?;
    let args = read(&c, ap, al)?;
    let known = matches!(name.as_str(), "clear_route_cache");
    let status = if known { OK } else { NOT_FOUND };
    trace(&mut c, || {
        format!(
            "proxy_call_foreign_function({name:?}, {} arg bytes) -> {}",
            args.len(),
            status_name(status)
        )
    });
    if known {
        let st = c.data_mut();
        let ctx = st.effective_ctx;
        let call = ForeignCall { ctx, name, args };
        match st.streams.get_mut(&ctx) {
            Some(s) => s.foreign_calls.push(call.clone()),
            None => st
                .violations
                .push(format!("{} called outside an HTTP stream", call.name)),
        }
        st.foreign_calls.push(call);
        write_u32(&mut c, rp, 0)?;
        write_u32(&mut c, rl, 0)?;
    }
    Ok(status)
}

fn set_effective_context(mut c: C<'_>, ctx: u32) -> R {
    let st = c.data_mut();
    let known = ctx == st.root_ctx || st.streams.contains_key(&ctx);
    if known {
        st.effective_ctx = ctx;
    }
    let status = if known { OK } else { BAD_ARGUMENT };
    trace(&mut c, || {
        format!(
            "proxy_set_effective_context({ctx}) -> {}",
            status_name(status)
        )
    });
    Ok(status)
}

/// Defines every `env` import of the ABI on the linker.
pub(crate) fn define(linker: &mut Linker<HostState>) -> wasmtime::Result<Vec<&'static str>> {
    let mut names = Vec::new();
    macro_rules! def {
        ($name:literal, $f:expr) => {
            linker.func_wrap("env", $name, $f)?;
            names.push($name);
        };
    }
    def!("proxy_log", log);
    def!("proxy_get_log_level", |mut c: C<'_>, ptr: u32| -> R {
        let level = c.data().log_level.raw();
        trace(&mut c, || format!("proxy_get_log_level() -> Ok {level}"));
        write_u32(&mut c, ptr, level)?;
        Ok(OK)
    });
    def!("proxy_get_current_time_nanoseconds", |mut c: C<'_>,
                                                ptr: u32|
     -> R {
        let now = c.data().now_ns();
        trace(&mut c, || {
            format!("proxy_get_current_time_nanoseconds() -> Ok {now}")
        });
        write_u64(&mut c, ptr, now)?;
        Ok(OK)
    });
    def!("proxy_set_tick_period_milliseconds", |mut c: C<'_>,
                                                period: u32|
     -> R {
        let now = c.data().now_ns();
        let st = c.data_mut();
        st.tick = (period > 0).then(|| (period, now.saturating_add(u64::from(period) * 1_000_000)));
        trace(&mut c, || {
            format!("proxy_set_tick_period_milliseconds({period}) -> Ok")
        });
        Ok(OK)
    });
    def!("proxy_get_buffer_bytes", get_buffer_bytes);
    def!("proxy_set_buffer_bytes", set_buffer_bytes);
    def!("proxy_get_header_map_pairs", get_header_map_pairs);
    def!("proxy_set_header_map_pairs", set_header_map_pairs);
    def!("proxy_get_header_map_value", get_header_map_value);
    def!("proxy_remove_header_map_value", |c: C<'_>,
                                           mt: u32,
                                           kp: u32,
                                           kl: u32|
     -> R {
        let key = read_string(&c, kp, kl)?;
        edit_map(c, mt, key, None, "remove")
    });
    def!("proxy_replace_header_map_value", |c: C<'_>,
                                            mt: u32,
                                            kp: u32,
                                            kl: u32,
                                            vp: u32,
                                            vl: u32|
     -> R {
        let key = read_string(&c, kp, kl)?;
        let v = read(&c, vp, vl)?;
        edit_map(c, mt, key, Some(v), "replace")
    });
    def!("proxy_add_header_map_value", |c: C<'_>,
                                        mt: u32,
                                        kp: u32,
                                        kl: u32,
                                        vp: u32,
                                        vl: u32|
     -> R {
        let key = read_string(&c, kp, kl)?;
        let v = read(&c, vp, vl)?;
        edit_map(c, mt, key, Some(v), "add")
    });
    def!("proxy_get_property", get_property);
    def!("proxy_set_property", set_property);
    def!("proxy_get_shared_data", get_shared_data);
    def!("proxy_set_shared_data", set_shared_data);
    def!("proxy_register_shared_queue", register_shared_queue);
    def!("proxy_resolve_shared_queue", resolve_shared_queue);
    def!("proxy_dequeue_shared_queue", dequeue_shared_queue);
    def!("proxy_enqueue_shared_queue", enqueue_shared_queue);
    def!("proxy_continue_stream", continue_stream);
    def!("proxy_close_stream", close_stream);
    def!("proxy_send_local_response", send_local_response);
    def!("proxy_http_call", http_call);
    // gRPC is not offered: each answers a status the SDK turns into an Err, never a panic.
    def!("proxy_grpc_call", |mut c: C<'_>,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32,
                             _: u32|
     -> R {
        trace(&mut c, || {
            "proxy_grpc_call(..) -> InternalFailure (gRPC not offered by this host)".into()
        });
        Ok(Status::InternalFailure as u32)
    });
    def!("proxy_grpc_stream", |mut c: C<'_>,
                               _: u32,
                               _: u32,
                               _: u32,
                               _: u32,
                               _: u32,
                               _: u32,
                               _: u32,
                               _: u32,
                               _: u32|
     -> R {
        trace(&mut c, || {
            "proxy_grpc_stream(..) -> InternalFailure (gRPC not offered by this host)".into()
        });
        Ok(Status::InternalFailure as u32)
    });
    def!("proxy_grpc_send", |mut c: C<'_>,
                             token: u32,
                             _: u32,
                             _: u32,
                             _: u32|
     -> R {
        trace(&mut c, || format!("proxy_grpc_send({token}) -> NotFound"));
        Ok(NOT_FOUND)
    });
    def!("proxy_grpc_cancel", |mut c: C<'_>, token: u32| -> R {
        trace(&mut c, || format!("proxy_grpc_cancel({token}) -> NotFound"));
        Ok(NOT_FOUND)
    });
    def!("proxy_grpc_close", |mut c: C<'_>, token: u32| -> R {
        trace(&mut c, || format!("proxy_grpc_close({token}) -> NotFound"));
        Ok(NOT_FOUND)
    });
    def!("proxy_get_status", |mut c: C<'_>,
                              code_ptr: u32,
                              ptr_ptr: u32,
                              size_ptr: u32|
     -> R {
        trace(&mut c, || "proxy_get_status() -> Ok 0".into());
        write_u32(&mut c, code_ptr, 0)?;
        write_u32(&mut c, ptr_ptr, 0)?;
        write_u32(&mut c, size_ptr, 0)?;
        Ok(OK)
    });
    def!("proxy_set_effective_context", set_effective_context);
    def!("proxy_call_foreign_function", call_foreign_function);
    def!("proxy_done", |mut c: C<'_>| -> R {
        trace(&mut c, || "proxy_done() -> Ok".into());
        Ok(OK)
    });
    def!("proxy_define_metric", define_metric);
    def!("proxy_get_metric", get_metric);
    def!("proxy_record_metric", record_metric);
    def!("proxy_increment_metric", increment_metric);
    Ok(names)
}
