//! A case before the binary names it: each area's module lists its cases by their own name
//! ([`Case::test`], [`Case::ignorable_test`], the `cases!` macro), and `main` turns them into
//! `libtest_mimic` trials named `AREA::NAME` ([`area`]), so an area's cases can be picked by
//! prefix (`cargo nextest run -p combined-upstreams-tests -E 'test(/^live_api::/)'`).

use ngx_harness::{expect_emerg, CaseResult, Completion, Failed, Trial};

type Test = Box<dyn FnOnce() -> CaseResult + Send>;
type Ignorable = Box<dyn FnOnce() -> Result<Completion, Failed> + Send>;

enum Run {
    Test(Test),
    Ignorable(Ignorable),
}

/// One case of an area: its name inside the area, how it runs, and whether it is ignored by
/// default (run with `--run-ignored`).
pub struct Case {
    name: String,
    run: Run,
    ignored: bool,
}

impl Case {
    /// A case that passes or fails ([`Trial::test`]).
    pub fn test(name: impl Into<String>, f: impl FnOnce() -> CaseResult + Send + 'static) -> Self {
        Case {
            name: name.into(),
            run: Run::Test(Box::new(f)),
            ignored: false,
        }
    }

    /// A case that may also report itself ignored at run time ([`Trial::ignorable_test`]).
    pub fn ignorable_test(
        name: impl Into<String>,
        f: impl FnOnce() -> Result<Completion, Failed> + Send + 'static,
    ) -> Self {
        Case {
            name: name.into(),
            run: Run::Ignorable(Box::new(f)),
            ignored: false,
        }
    }

    /// One `nginx -t` failure case: configuration and expected `[emerg]` text.
    pub fn emerg(name: impl Into<String>, http: &'static str, expected: &'static str) -> Self {
        Case::test(name, move || expect_emerg(http, expected))
    }

    /// Marks the case ignored unless asked for ([`Trial::with_ignored_flag`]).
    pub fn with_ignored_flag(self, ignored: bool) -> Self {
        Case { ignored, ..self }
    }

    fn into_trial(self, area: &str) -> Trial {
        let name = format!("{area}::{}", self.name);
        let trial = match self.run {
            Run::Test(f) => Trial::test(name, f),
            Run::Ignorable(f) => Trial::ignorable_test(name, f),
        };
        trial.with_ignored_flag(self.ignored)
    }
}

/// The cases of one area as trials named `AREA::NAME`.
pub fn area(name: &str, cases: Vec<Case>) -> impl Iterator<Item = Trial> + '_ {
    cases.into_iter().map(move |c| c.into_trial(name))
}
