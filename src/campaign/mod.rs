//! Campaigns: multi-stage GPU pipelines compiled from experiment configs (DESIGN.md §6).
//!
//! A campaign starts from three inputs: an experiment YAML (Hydra-style composition of
//! `defaults`, overrides and `${...}` interpolation, see [`config`]), a runner config and an
//! execution config. This module area turns them into a pure, deterministic plan.
//!
//! - [`config`]: loading YAML files, composing `defaults`, applying Hydra-style overrides and
//!   resolving interpolations into a [`config::Config`] tree with source locations.

pub mod config;
