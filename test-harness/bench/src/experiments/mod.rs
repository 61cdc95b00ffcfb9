//! The experiments, one per `bench` subcommand, each with its CLI arguments (`Args`) and its
//! `run`: [`runner`] (`bench run`, over [`scenarios`]), [`calibrate`], [`overhead`],
//! [`sidecar_cost`], [`scale`], [`soak`], [`flowbench`] (`bench flow`), [`demo`]. (`bench
//! dashboard-chart` draws a chart, nothing more: [`crate::report::dashboard_chart`].)

pub mod calibrate;
pub mod demo;
pub mod flowbench;
pub mod overhead;
pub mod runner;
pub mod scale;
pub mod scenarios;
pub mod sidecar_cost;
pub mod soak;
