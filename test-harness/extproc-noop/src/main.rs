//! `extproc-noop`: an Envoy external processor (`envoy.service.ext_proc.v3.ExternalProcessor`)
//! that changes nothing. Every `ProcessingRequest` gets the matching empty response (request
//! headers → `HeadersResponse` with no mutation, i.e. CONTINUE; a request body chunk →
//! `BodyResponse`; trailers, response headers and body alike), so Envoy carries on as if the
//! server were not there. What it costs is the floor of the endpoint-picker architecture (an
//! Envoy `ext_proc` filter talking gRPC to a picker): the picker's own work costs more than
//! nothing.
//!
//! The same port serves HTTP/1.1 `GET /health` (`ok`) and `GET /stats` (the counts, JSON), so a
//! test can see that requests really went through it.
//!
//! Usage: `extproc-noop --listen 127.0.0.1:PORT` (port 0 picks one); prints
//! `extproc-noop: listening on 127.0.0.1:PORT ready` and runs until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use clap::Parser;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, processing_response, BodyResponse, HeadersResponse, ProcessingRequest,
    ProcessingResponse, TrailersResponse,
};
use futures_util::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

#[derive(Parser, Debug)]
#[command(about = "A no-op Envoy ext_proc gRPC server (the endpoint-picker floor)")]
struct Args {
    /// Address to listen on (gRPC over HTTP/2, plus HTTP/1.1 /health and /stats).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

/// What went through the server since it started.
#[derive(Debug, Default)]
struct Counts {
    /// gRPC `Process` streams opened (one per HTTP request Envoy processes).
    streams: AtomicU64,
    request_headers: AtomicU64,
    request_body: AtomicU64,
    request_trailers: AtomicU64,
    response_headers: AtomicU64,
    response_body: AtomicU64,
    response_trailers: AtomicU64,
    /// Bytes of request and response body received.
    body_bytes: AtomicU64,
}

impl Counts {
    fn json(&self) -> serde_json::Value {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "streams": n(&self.streams),
            "request_headers": n(&self.request_headers),
            "request_body": n(&self.request_body),
            "request_trailers": n(&self.request_trailers),
            "response_headers": n(&self.response_headers),
            "response_body": n(&self.response_body),
            "response_trailers": n(&self.response_trailers),
            "body_bytes": n(&self.body_bytes),
        })
    }
}

/// The matching "carry on, unchanged" answer to one message (`None`: nothing to answer).
fn answer(counts: &Counts, req: ProcessingRequest) -> Option<ProcessingResponse> {
    use processing_request::Request as In;
    use processing_response::Response as Out;
    let bump = |c: &AtomicU64| c.fetch_add(1, Ordering::Relaxed);
    let response = match req.request? {
        In::RequestHeaders(_) => {
            bump(&counts.request_headers);
            Out::RequestHeaders(HeadersResponse::default())
        }
        In::RequestBody(b) => {
            bump(&counts.request_body);
            counts
                .body_bytes
                .fetch_add(b.body.len() as u64, Ordering::Relaxed);
            Out::RequestBody(BodyResponse::default())
        }
        In::RequestTrailers(_) => {
            bump(&counts.request_trailers);
            Out::RequestTrailers(TrailersResponse::default())
        }
        In::ResponseHeaders(_) => {
            bump(&counts.response_headers);
            Out::ResponseHeaders(HeadersResponse::default())
        }
        In::ResponseBody(b) => {
            bump(&counts.response_body);
            counts
                .body_bytes
                .fetch_add(b.body.len() as u64, Ordering::Relaxed);
            Out::ResponseBody(BodyResponse::default())
        }
        In::ResponseTrailers(_) => {
            bump(&counts.response_trailers);
            Out::ResponseTrailers(TrailersResponse::default())
        }
    };
    // In observability mode Envoy expects no answers.
    (!req.observability_mode).then(|| ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    })
}

#[derive(Debug)]
struct NoOp {
    counts: Arc<Counts>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for NoOp {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        self.counts.streams.fetch_add(1, Ordering::Relaxed);
        let counts = self.counts.clone();
        let answers = request.into_inner().filter_map(move |msg| {
            let out = match msg {
                Ok(req) => answer(&counts, req).map(Ok),
                // Envoy reset the stream (e.g. the client went away): end ours too.
                Err(status) => Some(Err(status)),
            };
            std::future::ready(out)
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => eprintln!("extproc-noop: SIGINT, stopping"),
        _ = term => eprintln!("extproc-noop: SIGTERM, stopping"),
    }
}

async fn run(args: Args) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("local address: {e}"))?;
    let counts = Arc::new(Counts::default());
    let stats = counts.clone();
    let router = Routes::new(ExternalProcessorServer::new(NoOp { counts }))
        .into_axum_router()
        .route("/health", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/stats",
            axum::routing::get(move || {
                let stats = stats.clone();
                async move { axum::Json(stats.json()) }
            }),
        );
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    println!("extproc-noop: listening on {addr} ready");
    tonic::transport::Server::builder()
        // /health and /stats over HTTP/1.1 on the same port; Envoy speaks HTTP/2.
        .accept_http1(true)
        // Flow-control windows sized from the measured bandwidth-delay product, as grpc-go
        // (the endpoint pickers' gRPC) does by default.
        .http2_adaptive_window(Some(true))
        .add_routes(Routes::from(router))
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await
        .map_err(|e| format!("server: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("extproc-noop: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("extproc-noop: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders};

    fn req(r: processing_request::Request) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(r),
            ..ProcessingRequest::default()
        }
    }

    #[test]
    fn each_message_gets_its_matching_empty_answer() {
        use processing_request::Request as In;
        use processing_response::Response as Out;
        let counts = Counts::default();
        let h = answer(&counts, req(In::RequestHeaders(HttpHeaders::default())));
        assert!(matches!(
            h.and_then(|r| r.response),
            Some(Out::RequestHeaders(HeadersResponse { response: None }))
        ));
        let body = HttpBody {
            body: vec![b'x'; 10],
            end_of_stream: true,
            ..HttpBody::default()
        };
        let b = answer(&counts, req(In::RequestBody(body)));
        assert!(matches!(
            b.and_then(|r| r.response),
            Some(Out::RequestBody(BodyResponse { response: None }))
        ));
        let rh = answer(&counts, req(In::ResponseHeaders(HttpHeaders::default())));
        assert!(matches!(
            rh.and_then(|r| r.response),
            Some(Out::ResponseHeaders(_))
        ));
        assert_eq!(answer(&counts, ProcessingRequest::default()), None);
        let j = counts.json();
        assert_eq!(j["request_headers"], 1);
        assert_eq!(j["request_body"], 1);
        assert_eq!(j["response_headers"], 1);
        assert_eq!(j["body_bytes"], 10);
    }

    #[test]
    fn observability_mode_gets_no_answer() {
        let counts = Counts::default();
        let mut r = req(processing_request::Request::RequestHeaders(
            HttpHeaders::default(),
        ));
        r.observability_mode = true;
        assert_eq!(answer(&counts, r), None);
        assert_eq!(counts.json()["request_headers"], 1);
    }
}
