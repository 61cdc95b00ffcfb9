//! `model-sim` binary: starts the pods the command line asks for, prints one ready line per
//! pod (`model-sim: pod 127.0.0.1:9001 profile=h100 engine=vllm ready`) and runs until SIGTERM,
//! SIGINT, or until every pod has been stopped by a `die` fault.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use model_sim::config::{resolve, Cli};
use model_sim::metrics::Flavor;
use model_sim::server::spawn_pod;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (pods, threads) = match resolve(&cli) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("model-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("model-sim: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(async move {
        let mut handles = Vec::with_capacity(pods.len());
        for cfg in pods {
            match spawn_pod(cfg).await {
                Ok(h) => {
                    let c = h.pod().config();
                    let engine = match c.flavor {
                        Flavor::Vllm => "vllm",
                        Flavor::Sglang => "sglang",
                    };
                    let mode = if c.metrics_only {
                        " mode=metrics-only"
                    } else {
                        ""
                    };
                    println!(
                        "model-sim: pod {} profile={} engine={engine}{mode} ready",
                        h.addr(),
                        c.profile.name
                    );
                    let _ = std::io::stdout().flush();
                    handles.push(h);
                }
                Err(e) => {
                    eprintln!("model-sim: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        let all_stopped = async {
            for h in &handles {
                h.stopped().await;
            }
        };
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => eprintln!("model-sim: SIGINT, stopping"),
            _ = term => eprintln!("model-sim: SIGTERM, stopping"),
            _ = all_stopped => eprintln!("model-sim: every pod stopped"),
        }
        drop(handles);
        ExitCode::SUCCESS
    })
}
