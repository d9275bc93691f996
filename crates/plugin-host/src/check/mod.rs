//! Conformance checker: exercises a plugin folder with the protocol's edge cases.
//!
//! [`check_plugin`] validates the manifest, starts the executable and talks to it directly (not
//! through [`crate::PluginHost`], which would refuse some of the edge cases before the plugin sees
//! them). A valid resolve needs a working backend, which the checker cannot know: it reads a sample
//! from `conformance.json` in the plugin folder (see [`Sample`]) or from [`CheckOptions::sample`];
//! without one, the checks that need it are skipped, not failed.
//!
//! The vocabulary (what a sample, a check and a report are) is here; `run` holds the checks in
//! their order and what each expects, `session` the plugin process driven line by line.

mod run;
mod session;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tributary_protocol::ConfigMap;

pub use run::{check_plugin, check_plugin_with};

/// File in a plugin folder that gives the checker a sample resolve.
pub const SAMPLE_FILE: &str = "conformance.json";

/// A resolve that works against the plugin's backend, e.g. for `static`:
/// `{"provider":"static","config":{"targets":"127.0.0.1:8080"},"service":"demo"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    pub provider: String,
    pub config: ConfigMap,
    pub service: String,
    /// A service the provider does not know (answered with -32003, `data.field` = `"service"`).
    /// Leave it out for providers where every service resolves.
    #[serde(default)]
    pub unknown_service: Option<String>,
}

/// Options of [`check_plugin_with`].
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// How long the plugin may take for one answer (default 10 s).
    pub timeout: Duration,
    /// The sample; `None` reads `conformance.json` from the plugin folder when there is one.
    pub sample: Option<Sample>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            sample: None,
        }
    }
}

/// Outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// One check and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Everything the checker found. `Display` prints one line per check and a summary line, each
/// ending in `\n`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub dir: PathBuf,
    /// The plugin's name, when the manifest could be read.
    pub plugin: Option<String>,
    pub checks: Vec<Check>,
}

impl CheckReport {
    /// No check failed.
    pub fn passed(&self) -> bool {
        !self
            .checks
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Fail(_)))
    }

    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Fail(_)))
            .collect()
    }

    pub(crate) fn push(&mut self, name: impl Into<String>, outcome: Outcome) {
        self.checks.push(Check {
            name: name.into(),
            outcome,
        });
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plugin {} ({})",
            self.plugin.as_deref().unwrap_or("?"),
            self.dir.display()
        )?;
        let (mut pass, mut fail, mut skip) = (0, 0, 0);
        for c in &self.checks {
            match &c.outcome {
                Outcome::Pass => {
                    pass += 1;
                    writeln!(f, "  PASS  {}", c.name)?
                }
                Outcome::Fail(d) => {
                    fail += 1;
                    writeln!(f, "  FAIL  {}: {d}", c.name)?
                }
                Outcome::Skip(d) => {
                    skip += 1;
                    writeln!(f, "  SKIP  {}: {d}", c.name)?
                }
            }
        }
        let verdict = if fail == 0 {
            "conforms"
        } else {
            "does NOT conform"
        };
        writeln!(
            f,
            "{verdict}: {pass} of {} checks passed, {fail} failing, {skip} skipped",
            pass + fail + skip
        )
    }
}
