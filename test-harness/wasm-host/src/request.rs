//! One HTTP stream driven through the module like Envoy's HTTP connection manager drives a Wasm
//! filter: headers, body chunks (end_of_stream on the last), trailers; the returned actions
//! honoured (a paused stream is held and its body buffered; `proxy_continue_stream` resumes
//! it; a local reply ends the request and passes through the filter's response callbacks);
//! then the response, and `proxy_on_done` / `proxy_on_log` / `proxy_on_delete`.
//!
//! Tests read what the filter did: headers as forwarded upstream, the local response, the
//! route-cache clears, logs and any violation of what Envoy allows.

use crate::abi::{Action, Pairs};
use crate::error::HostError;
use crate::state::{ForeignCall, LocalResponse, LogEntry, StreamState};
use crate::vm::{PropertyValue, Vm, VmInner};

/// What Envoy did with one stream so far (the module's view lives in [`StreamState`]).
#[derive(Debug, Default)]
pub(crate) struct Flow {
    // (fields are read through `Request`)
    pub req_paused: bool,
    /// Every request callback (headers, body to end_of_stream, trailers) was delivered.
    pub req_received: bool,
    pub upstream_headers: Option<Pairs>,
    pub upstream_body: Vec<u8>,
    pub upstream_trailers: Option<Pairs>,
    pub upstream_complete: bool,
    pub resp_paused: bool,
    pub resp_received: bool,
    pub downstream_headers: Option<Pairs>,
    pub downstream_body: Vec<u8>,
    pub downstream_trailers: Option<Pairs>,
    pub downstream_complete: bool,
    pub local_reply_sent: bool,
    /// A local reply Envoy itself sent (e.g. 413 past the buffer limit), not the filter.
    pub envoy_reply: Option<LocalResponse>,
    pub in_response: bool,
    pub reset: bool,
    pub finished: bool,
    pub actions: Vec<(String, Action)>,
    pub done_result: Option<bool>,
    /// The module's stream state, moved here by `proxy_on_delete`.
    pub final_stream: Option<StreamState>,
}

impl Flow {
    fn ended(&self) -> bool {
        self.local_reply_sent || self.reset
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Request,
    Response,
}

fn to_pairs(h: &[(&str, &str)]) -> Pairs {
    h.iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
        .collect()
}

fn find(p: &Pairs, name: &str) -> Option<String> {
    let name = name.to_ascii_lowercase();
    p.iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

fn strings(p: &Pairs) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

fn n32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl VmInner {
    fn stream(&mut self, ctx: u32) -> &mut StreamState {
        self.store.data_mut().streams.entry(ctx).or_default()
    }

    fn flow(&mut self, ctx: u32) -> &mut Flow {
        self.flows.entry(ctx).or_default()
    }

    fn open(&mut self, ctx: u32, props: Vec<(String, Vec<u8>)>) -> Result<(), HostError> {
        self.stream(ctx).properties.extend(props);
        self.flow(ctx);
        let root = self.store.data().root_ctx;
        self.call(
            |e| &e.context_create,
            ctx,
            format!("proxy_on_context_create(ctx={ctx}, root={root})"),
            (ctx, root),
        )?;
        Ok(())
    }

    fn headers(&mut self, dir: Dir, ctx: u32, h: Pairs, eos: bool) -> Result<(), HostError> {
        let n = n32(h.len());
        let s = self.stream(ctx);
        let r = match dir {
            Dir::Request => {
                s.request_headers = Some(h);
                let what = format!("proxy_on_request_headers(ctx={ctx}, headers={n}, eos={eos})");
                self.call(|e| &e.request_headers, ctx, what, (ctx, n, u32::from(eos)))?
            }
            Dir::Response => {
                s.response_headers = Some(h);
                let what = format!("proxy_on_response_headers(ctx={ctx}, headers={n}, eos={eos})");
                self.call(|e| &e.response_headers, ctx, what, (ctx, n, u32::from(eos)))?
            }
        };
        self.after(dir, ctx, "headers", r, eos)
    }

    fn body(&mut self, dir: Dir, ctx: u32, chunk: &[u8], eos: bool) -> Result<(), HostError> {
        let s = self.stream(ctx);
        // Envoy adds the new chunk to what it buffers for this filter and shows it all.
        let slot = match dir {
            Dir::Request => {
                s.request_body_eos = eos;
                &mut s.request_body
            }
            Dir::Response => {
                s.response_body_eos = eos;
                &mut s.response_body
            }
        };
        let mut buf = slot.take().unwrap_or_default();
        buf.extend_from_slice(chunk);
        let size = n32(buf.len());
        *slot = Some(buf);
        let r = match dir {
            Dir::Request => {
                let what = format!("proxy_on_request_body(ctx={ctx}, size={size}, eos={eos})");
                self.call(|e| &e.request_body, ctx, what, (ctx, size, u32::from(eos)))
            }
            Dir::Response => {
                let what = format!("proxy_on_response_body(ctx={ctx}, size={size}, eos={eos})");
                self.call(|e| &e.response_body, ctx, what, (ctx, size, u32::from(eos)))
            }
        };
        let s = self.stream(ctx);
        s.request_body_eos = false;
        s.response_body_eos = false;
        self.after(dir, ctx, "body", r?, eos)
    }

    fn trailers(&mut self, dir: Dir, ctx: u32, t: Pairs) -> Result<(), HostError> {
        let n = n32(t.len());
        let s = self.stream(ctx);
        let r = match dir {
            Dir::Request => {
                s.request_trailers = Some(t);
                let what = format!("proxy_on_request_trailers(ctx={ctx}, trailers={n})");
                self.call(|e| &e.request_trailers, ctx, what, (ctx, n))?
            }
            Dir::Response => {
                s.response_trailers = Some(t);
                let what = format!("proxy_on_response_trailers(ctx={ctx}, trailers={n})");
                self.call(|e| &e.response_trailers, ctx, what, (ctx, n))?
            }
        };
        self.after(dir, ctx, "trailers", r, true)
    }

    /// Applies what a callback returned and asked for, in Envoy's order: a reset or local
    /// reply first (they end the stream), else the action, else a `proxy_continue_stream`.
    fn after(
        &mut self,
        dir: Dir,
        ctx: u32,
        step: &str,
        raw: Option<u32>,
        last: bool,
    ) -> Result<(), HostError> {
        let action = raw.map(Action::from_raw).unwrap_or(Action::Continue);
        let label = match dir {
            Dir::Request => format!("request {step}"),
            Dir::Response => format!("response {step}"),
        };
        self.flow(ctx).actions.push((label.clone(), action));
        if let Action::Other(v) = action {
            self.store.data_mut().effective_ctx = ctx;
            self.store.data_mut().violation(format!(
                "{label} returned action {v}, which is neither Continue nor Pause"
            ));
        }
        {
            let f = self.flow(ctx);
            if last {
                match dir {
                    Dir::Request => f.req_received = true,
                    Dir::Response => f.resp_received = true,
                }
            }
        }
        if self.settle(ctx)? {
            return Ok(());
        }
        let s = self.stream(ctx);
        let resume = match dir {
            Dir::Request => std::mem::take(&mut s.resume_request),
            Dir::Response => std::mem::take(&mut s.resume_response),
        };
        if action != Action::Pause || resume {
            self.release(dir, ctx);
        } else {
            let f = self.flow(ctx);
            match dir {
                Dir::Request => f.req_paused = true,
                Dir::Response => f.resp_paused = true,
            }
            let buffered = self.stream(ctx).request_body.as_ref().map_or(0, Vec::len);
            let held = !self.stream(ctx).request_headers_sent;
            if let (Dir::Request, Some(limit)) = (dir, self.buffer_limit) {
                if buffered > limit && held {
                    // Envoy's own answer when a filter buffers more than the limit.
                    let lr = LocalResponse {
                        status: 413,
                        details: "request_payload_too_large".into(),
                        body: b"Payload Too Large".to_vec(),
                        headers: vec![("content-type".into(), "text/plain".into())],
                        grpc_status: -1,
                    };
                    let st = self.store.data_mut();
                    st.trace.push(|| format!("[host] Envoy: {buffered} buffered bytes > buffer limit {limit}: local reply 413"));
                    self.flow(ctx).envoy_reply = Some(lr.clone());
                    self.local_reply(ctx, lr)?;
                }
            }
        }
        Ok(())
    }

    /// Handles a reset or a local reply asked for on `ctx`; true when the stream ended.
    fn settle(&mut self, ctx: u32) -> Result<bool, HostError> {
        let s = self.stream(ctx);
        if s.reset {
            self.flow(ctx).reset = true;
            return Ok(true);
        }
        let lr = s.local_response.clone();
        if self.flow(ctx).local_reply_sent {
            return Ok(true);
        }
        let Some(lr) = lr else { return Ok(false) };
        self.local_reply(ctx, lr)?;
        Ok(true)
    }

    /// Sends a local reply downstream; like Envoy, after the callback that asked for it, and
    /// through this filter's response callbacks.
    fn local_reply(&mut self, ctx: u32, lr: LocalResponse) -> Result<(), HostError> {
        let through = self.local_reply_through_filter && !self.flow(ctx).in_response;
        {
            let f = self.flow(ctx);
            f.local_reply_sent = true;
            f.req_paused = false;
        }
        let mut h: Pairs = vec![(":status".into(), lr.status.to_string().into_bytes())];
        h.extend(
            lr.headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.clone().into_bytes())),
        );
        h.push((
            "content-length".into(),
            lr.body.len().to_string().into_bytes(),
        ));
        let s = self.stream(ctx);
        s.response_headers = None;
        s.response_body = None;
        if through {
            self.flow(ctx).in_response = true;
            let eos = lr.body.is_empty();
            self.headers(Dir::Response, ctx, h, eos)?;
            if !eos {
                self.body(Dir::Response, ctx, &lr.body, true)?;
            }
            // Whatever the filter did with it, the local reply is what the client gets.
            let s = self.stream(ctx);
            let final_headers = s.response_headers.clone().unwrap_or_default();
            let body = s.response_body.take();
            let f = self.flow(ctx);
            f.downstream_headers = Some(final_headers);
            f.downstream_body = body.unwrap_or(lr.body);
        } else {
            let f = self.flow(ctx);
            f.downstream_headers = Some(h);
            f.downstream_body = lr.body;
        }
        let f = self.flow(ctx);
        f.downstream_complete = true;
        f.resp_paused = false;
        Ok(())
    }

    /// Envoy lets held data go on: headers (once), buffered body, trailers when complete.
    fn release(&mut self, dir: Dir, ctx: u32) {
        let s = self.stream(ctx);
        let (headers, body, trailers) = match dir {
            Dir::Request => {
                s.request_headers_sent = true;
                (
                    s.request_headers.clone(),
                    s.request_body.take(),
                    s.request_trailers.clone(),
                )
            }
            Dir::Response => {
                s.response_headers_sent = true;
                (
                    s.response_headers.clone(),
                    s.response_body.take(),
                    s.response_trailers.clone(),
                )
            }
        };
        let f = self.flow(ctx);
        let (h, b, t, paused, received, complete) = match dir {
            Dir::Request => (
                &mut f.upstream_headers,
                &mut f.upstream_body,
                &mut f.upstream_trailers,
                &mut f.req_paused,
                f.req_received,
                &mut f.upstream_complete,
            ),
            Dir::Response => (
                &mut f.downstream_headers,
                &mut f.downstream_body,
                &mut f.downstream_trailers,
                &mut f.resp_paused,
                f.resp_received,
                &mut f.downstream_complete,
            ),
        };
        if h.is_none() {
            *h = headers;
        }
        if let Some(body) = body {
            b.extend_from_slice(&body);
        }
        *paused = false;
        if received {
            *t = trailers;
            *complete = true;
        }
    }

    /// After a callback outside any stream callback (tick, http-call answer, queue): acts on
    /// local replies, resets and `proxy_continue_stream` requests of every open stream.
    pub(crate) fn after_out_of_band(&mut self, _ctx: u32) -> Result<(), HostError> {
        let mut open: Vec<u32> = self
            .flows
            .iter()
            .filter(|(_, f)| !f.finished)
            .map(|(c, _)| *c)
            .collect();
        open.sort_unstable();
        for ctx in open {
            if self.settle(ctx)? {
                continue;
            }
            let s = self.stream(ctx);
            let (rq, rs) = (
                std::mem::take(&mut s.resume_request),
                std::mem::take(&mut s.resume_response),
            );
            if rq && self.flow(ctx).req_paused {
                self.release(Dir::Request, ctx);
            }
            if rs && self.flow(ctx).resp_paused {
                self.release(Dir::Response, ctx);
            }
        }
        Ok(())
    }

    fn finish(&mut self, ctx: u32) -> Result<(), HostError> {
        if self.flow(ctx).finished {
            return Ok(());
        }
        self.flow(ctx).finished = true;
        let log = |i: &mut VmInner| {
            i.call(|e| &e.log, ctx, format!("proxy_on_log(ctx={ctx})"), ctx)
                .map(|_| ())
        };
        if self.log_before_done {
            log(self)?;
        }
        let done = self.call(|e| &e.done, ctx, format!("proxy_on_done(ctx={ctx})"), ctx)?;
        self.flow(ctx).done_result = done.map(|d| d != 0);
        if !self.log_before_done {
            log(self)?;
        }
        self.call(
            |e| &e.delete,
            ctx,
            format!("proxy_on_delete(ctx={ctx})"),
            ctx,
        )?;
        let s = self.store.data_mut().streams.remove(&ctx);
        self.flow(ctx).final_stream = s;
        Ok(())
    }
}

/// A response an upstream sends, for [`Request::respond_with`].
#[derive(Debug, Clone, Default)]
pub struct Response {
    headers: Pairs,
    chunks: Vec<Vec<u8>>,
    trailers: Option<Pairs>,
}

impl Response {
    /// A response with this `:status`.
    pub fn new(status: u16) -> Response {
        Response {
            headers: vec![(":status".into(), status.to_string().into_bytes())],
            ..Default::default()
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Response {
        self.headers
            .push((k.to_ascii_lowercase(), v.as_bytes().to_vec()));
        self
    }

    pub fn chunk(mut self, c: impl AsRef<[u8]>) -> Response {
        self.chunks.push(c.as_ref().to_vec());
        self
    }

    pub fn trailers(mut self, t: &[(&str, &str)]) -> Response {
        self.trailers = Some(to_pairs(t));
        self
    }
}

/// One HTTP stream on a [`Vm`]. Build it (headers, body, trailers, properties), [`send`]
/// it, read what the filter did, [`respond`] as the upstream, then [`finish`] it.
///
/// [`send`]: Request::send
/// [`respond`]: Request::respond
/// [`finish`]: Request::finish
pub struct Request {
    vm: Vm,
    ctx: Option<u32>,
    headers: Pairs,
    chunks: Vec<Vec<u8>>,
    trailers: Option<Pairs>,
    props: Vec<(String, Vec<u8>)>,
}

impl Request {
    pub(crate) fn new(vm: Vm) -> Request {
        Request {
            vm,
            ctx: None,
            headers: Vec::new(),
            chunks: Vec::new(),
            trailers: None,
            props: Vec::new(),
        }
    }

    /// Adds one request header.
    pub fn header(&mut self, k: &str, v: &str) -> &mut Self {
        self.headers
            .push((k.to_ascii_lowercase(), v.as_bytes().to_vec()));
        self
    }

    /// Adds a request header whose value is not text (clients can send any bytes).
    pub fn header_bytes(&mut self, k: &str, v: &[u8]) -> &mut Self {
        self.headers.push((k.to_ascii_lowercase(), v.to_vec()));
        self
    }

    /// Adds request headers, in order.
    pub fn headers(&mut self, h: &[(&str, &str)]) -> &mut Self {
        self.headers.extend(to_pairs(h));
        self
    }

    /// The whole body as one chunk.
    pub fn body(&mut self, b: impl AsRef<[u8]>) -> &mut Self {
        self.chunks.push(b.as_ref().to_vec());
        self
    }

    /// The body as these chunks (one `proxy_on_request_body` each).
    pub fn body_chunks<I, B>(&mut self, chunks: I) -> &mut Self
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        self.chunks
            .extend(chunks.into_iter().map(|c| c.as_ref().to_vec()));
        self
    }

    /// The body cut into chunks of `size` bytes (the last may be shorter).
    pub fn body_split(&mut self, b: impl AsRef<[u8]>, size: usize) -> &mut Self {
        self.chunks
            .extend(b.as_ref().chunks(size.max(1)).map(<[u8]>::to_vec));
        self
    }

    pub fn trailers(&mut self, t: &[(&str, &str)]) -> &mut Self {
        self.trailers = Some(to_pairs(t));
        self
    }

    /// A per-stream property, e.g. `("source.address", "127.0.0.1:50000")`,
    /// `("upstream.address", "10.0.0.7:8000")`. Settable before or after `send`.
    pub fn property(&mut self, path: &str, value: impl Into<PropertyValue>) -> &mut Self {
        let v = value.into().0;
        match self.ctx {
            Some(ctx) => {
                let mut i = self.vm.0.borrow_mut();
                if let Some(s) = i.store.data_mut().streams.get_mut(&ctx) {
                    s.properties.insert(path.into(), v);
                }
            }
            None => self.props.push((path.into(), v)),
        }
        self
    }

    /// Creates the stream's context and delivers headers, body chunks and trailers, honouring
    /// what the filter returns. Stops early when the filter ends the stream.
    pub fn send(&mut self) -> Result<&mut Self, HostError> {
        if self.ctx.is_some() {
            return Err(HostError::Usage("request already sent".into()));
        }
        let vm = self.vm.clone();
        let mut i = vm.0.borrow_mut();
        let ctx = i.next_ctx;
        i.next_ctx += 1;
        self.ctx = Some(ctx);
        i.open(ctx, std::mem::take(&mut self.props))?;
        let no_more = self.chunks.is_empty() && self.trailers.is_none();
        i.headers(Dir::Request, ctx, self.headers.clone(), no_more)?;
        let n = self.chunks.len();
        for (k, chunk) in self.chunks.iter().enumerate() {
            if i.flow(ctx).ended() {
                return Ok(self);
            }
            let eos = k + 1 == n && self.trailers.is_none();
            i.body(Dir::Request, ctx, chunk, eos)?;
        }
        if let Some(t) = self.trailers.clone() {
            if !i.flow(ctx).ended() {
                i.trailers(Dir::Request, ctx, t)?;
            }
        }
        drop(i);
        Ok(self)
    }

    /// The upstream answers with these headers (must include `:status`) and body chunks.
    pub fn respond(
        &mut self,
        headers: &[(&str, &str)],
        chunks: &[&[u8]],
    ) -> Result<&mut Self, HostError> {
        let mut r = Response {
            headers: to_pairs(headers),
            ..Default::default()
        };
        r.chunks = chunks.iter().map(|c| c.to_vec()).collect();
        self.respond_with(r)
    }

    /// The upstream answers with `r`.
    pub fn respond_with(&mut self, r: Response) -> Result<&mut Self, HostError> {
        let ctx = self.sent_ctx()?;
        let vm = self.vm.clone();
        let mut i = vm.0.borrow_mut();
        let f = i.flow(ctx);
        if f.ended() {
            return Err(HostError::Usage(format!(
                "stream {ctx} already ended (local reply or reset); no upstream response can come"
            )));
        }
        if f.upstream_headers.is_none() {
            return Err(HostError::Usage(format!(
                "stream {ctx}: the filter still holds the request headers; nothing went upstream"
            )));
        }
        if f.in_response {
            return Err(HostError::Usage(format!(
                "stream {ctx} already has a response"
            )));
        }
        f.in_response = true;
        let no_more = r.chunks.is_empty() && r.trailers.is_none();
        i.headers(Dir::Response, ctx, r.headers, no_more)?;
        let n = r.chunks.len();
        for (k, chunk) in r.chunks.iter().enumerate() {
            if i.flow(ctx).ended() {
                return Ok(self);
            }
            i.body(
                Dir::Response,
                ctx,
                chunk,
                k + 1 == n && r.trailers.is_none(),
            )?;
        }
        if let Some(t) = r.trailers {
            if !i.flow(ctx).ended() {
                i.trailers(Dir::Response, ctx, t)?;
            }
        }
        drop(i);
        Ok(self)
    }

    /// Ends the stream as Envoy does when it completes or the client goes away:
    /// `proxy_on_done`, `proxy_on_log`, `proxy_on_delete` (order per [`crate::VmBuilder::log_before_done`]).
    pub fn finish(&mut self) -> Result<&mut Self, HostError> {
        let ctx = self.sent_ctx()?;
        self.vm.0.borrow_mut().finish(ctx)?;
        Ok(self)
    }

    fn sent_ctx(&self) -> Result<u32, HostError> {
        self.ctx
            .ok_or_else(|| HostError::Usage("request not sent yet".into()))
    }

    fn read<T>(&self, f: impl FnOnce(Option<&StreamState>, Option<&Flow>) -> T) -> T {
        let i = self.vm.0.borrow();
        let Some(ctx) = self.ctx else {
            return f(None, None);
        };
        let flow = i.flows.get(&ctx);
        let s = i
            .store
            .data()
            .streams
            .get(&ctx)
            .or_else(|| flow.and_then(|f| f.final_stream.as_ref()));
        f(s, flow)
    }

    /// The context id (after `send`).
    pub fn ctx(&self) -> Option<u32> {
        self.ctx
    }

    /// A request header as the filter left it (whether or not it went upstream).
    pub fn request_header(&self, name: &str) -> Option<String> {
        self.read(|s, _| find(s?.request_headers.as_ref()?, name))
    }

    /// Every request header as the filter left it.
    pub fn request_headers(&self) -> Vec<(String, String)> {
        self.read(|s, _| {
            s.and_then(|s| s.request_headers.as_ref())
                .map(strings)
                .unwrap_or_default()
        })
    }

    /// A request header as it went upstream; `None` if absent or nothing went upstream.
    pub fn upstream_header(&self, name: &str) -> Option<String> {
        self.read(|_, f| find(f?.upstream_headers.as_ref()?, name))
    }

    /// True when the request headers went upstream.
    pub fn forwarded(&self) -> bool {
        self.read(|_, f| f.is_some_and(|f| f.upstream_headers.is_some()))
    }

    /// True when headers, the whole body and trailers went upstream.
    pub fn forwarded_complete(&self) -> bool {
        self.read(|_, f| f.is_some_and(|f| f.upstream_complete))
    }

    /// The request body as it went upstream.
    pub fn upstream_body(&self) -> Vec<u8> {
        self.read(|_, f| f.map(|f| f.upstream_body.clone()).unwrap_or_default())
    }

    /// True when the filter holds the request (paused, waiting for `proxy_continue_stream`).
    pub fn is_paused(&self) -> bool {
        self.read(|_, f| f.is_some_and(|f| f.req_paused))
    }

    /// A local reply Envoy sent on its own (413 past the buffer limit), if any.
    pub fn envoy_reply(&self) -> Option<LocalResponse> {
        self.read(|_, f| f?.envoy_reply.clone())
    }

    /// The local reply the filter sent, if any.
    pub fn local_response(&self) -> Option<LocalResponse> {
        self.read(|s, _| s?.local_response.clone())
    }

    /// Every action returned, labelled (`"request headers"`, `"request body"`, ...).
    pub fn actions(&self) -> Vec<(String, Action)> {
        self.read(|_, f| f.map(|f| f.actions.clone()).unwrap_or_default())
    }

    /// Foreign functions the filter called on this stream.
    pub fn foreign_calls(&self) -> Vec<ForeignCall> {
        self.read(|s, _| s.map(|s| s.foreign_calls.clone()).unwrap_or_default())
    }

    /// True when the filter called `clear_route_cache` on this stream.
    pub fn cleared_route_cache(&self) -> bool {
        self.foreign_calls()
            .iter()
            .any(|c| c.name == "clear_route_cache")
    }

    /// What the filter did that Envoy would not allow or would ignore.
    pub fn violations(&self) -> Vec<String> {
        self.read(|s, _| s.map(|s| s.violations.clone()).unwrap_or_default())
    }

    /// True when the filter reset the stream (`proxy_close_stream`).
    pub fn was_reset(&self) -> bool {
        self.read(|_, f| f.is_some_and(|f| f.reset))
    }

    /// The response status the client gets (local reply or upstream's, after the filter).
    pub fn response_status(&self) -> Option<u16> {
        self.response_header(":status").and_then(|s| s.parse().ok())
    }

    /// A response header as the client gets it.
    pub fn response_header(&self, name: &str) -> Option<String> {
        self.read(|s, f| {
            let f = f?;
            match &f.downstream_headers {
                Some(h) => find(h, name),
                None => find(s?.response_headers.as_ref()?, name),
            }
        })
    }

    /// Every response header as the client gets it.
    pub fn response_headers(&self) -> Vec<(String, String)> {
        self.read(|_, f| {
            f.and_then(|f| f.downstream_headers.as_ref())
                .map(strings)
                .unwrap_or_default()
        })
    }

    /// The response body as the client gets it.
    pub fn response_body(&self) -> Vec<u8> {
        self.read(|_, f| f.map(|f| f.downstream_body.clone()).unwrap_or_default())
    }

    /// True when the filter holds the response.
    pub fn response_paused(&self) -> bool {
        self.read(|_, f| f.is_some_and(|f| f.resp_paused))
    }

    /// What `proxy_on_done` answered, once finished.
    pub fn done_result(&self) -> Option<bool> {
        self.read(|_, f| f.and_then(|f| f.done_result))
    }

    /// Log lines written while this stream was the current context.
    pub fn logs(&self) -> Vec<LogEntry> {
        let Some(ctx) = self.ctx else {
            return Vec::new();
        };
        self.vm
            .logs()
            .into_iter()
            .filter(|l| l.ctx == ctx)
            .collect()
    }

    /// A summary for assertion messages: actions, local reply, violations, last crossings.
    pub fn explain(&self) -> String {
        let mut out = format!("stream ctx={:?}\nactions: {:?}\n", self.ctx, self.actions());
        if let Some(lr) = self.local_response() {
            out.push_str(&format!(
                "local response: {} {:?} {}\n",
                lr.status,
                lr.headers,
                lr.body_text()
            ));
        }
        out.push_str(&format!(
            "request headers now: {:?}\n",
            self.request_headers()
        ));
        let v = self.violations();
        if !v.is_empty() {
            out.push_str(&format!("violations: {v:?}\n"));
        }
        out.push_str("--- logs ---\n");
        out.push_str(&self.vm.log_text());
        out.push_str("--- last crossings ---\n");
        out.push_str(&self.vm.trace_tail(60));
        out
    }
}
