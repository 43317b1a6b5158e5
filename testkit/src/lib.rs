//! Test support shared by the workspace's test suites: what a test that needs something from
//! outside the repository (a Postgres server, a Garage bucket, a program on `PATH`) does when
//! that is missing.
//!
//! Such tests are marked `#[ignore = "needs <what>: <how to provide it>"]`, so a plain
//! `cargo test` lists them as ignored instead of counting them as passed; CI runs them with
//! `-- --include-ignored`. Inside the test, [`require`] (or [`require_program`]) returns what
//! the test needs, or `None` after a skip note when it is missing, and panics instead when
//! `CI=true`: a CI run can never pass without the services it is meant to test against.
//!
//! The modules: [`garage`] (a Garage of a test's own, to kill and restart), [`history`] (the
//! fault test's history checker), [`consumer`] (what a named consumer's registration, acquires
//! and acks promise across faults), [`lifecycle`] (what creates, closes, deletes and trims
//! promise across faults), [`pg_proxy`] (a fault proxy in front of Postgres: lost
//! COMMIT answers, held answers, delayed statements, cut and refused connections), [`netns`] (a
//! network of namespaces whose links a test cuts and heals).

use std::path::Path;

/// An outside service, named by the environment variables that point the tests at it.
pub struct Service {
    /// What it is, for messages ("Postgres").
    pub name: &'static str,
    /// The variables that must all be set and non-empty; [`require`] returns their values in
    /// this order.
    pub vars: &'static [&'static str],
    /// How to provide it, for messages.
    pub how: &'static str,
}

/// The Postgres server the metadata tests create their databases on.
pub const POSTGRES: Service = Service {
    name: "Postgres",
    vars: &["PICOMQ_PG_URL"],
    how: "scripts/pg-up.sh, then PICOMQ_PG_URL=postgres://postgres:postgres@127.0.0.1:5432/picomq",
};

/// The S3 server (Garage in CI) the `s3://` tests use, with its credentials.
pub const GARAGE: Service = Service {
    name: "Garage",
    vars: &[
        "PICOMQ_S3_ENDPOINT",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ],
    how: "scripts/garage-up.sh with the variables .ci/run exports",
};

/// Whether this is a CI run (`CI=true`, as CI services and `.ci/run` set it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// The values of `service`'s variables, or `None` after printing why `test` is skipped.
///
/// # Panics
///
/// When a variable is missing and [`in_ci`].
pub fn require(test: &str, service: &Service) -> Option<Vec<String>> {
    let values: Vec<Option<String>> = service
        .vars
        .iter()
        .map(|var| std::env::var(var).ok().filter(|value| !value.is_empty()))
        .collect();
    let missing: Vec<&str> = service
        .vars
        .iter()
        .zip(&values)
        .filter(|(_, value)| value.is_none())
        .map(|(var, _)| *var)
        .collect();
    if missing.is_empty() {
        return Some(values.into_iter().flatten().collect());
    }
    missing_service(
        test,
        &format!(
            "needs {} ({} unset; {})",
            service.name,
            missing.join(", "),
            service.how
        ),
    );
    None
}

/// Whether `program` is on `PATH`; `false` after printing why `test` is skipped.
///
/// # Panics
///
/// When it is not and [`in_ci`] (`.ci/run` installs every program a test needs).
pub fn require_program(test: &str, program: &str, how: &str) -> bool {
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| is_executable(&dir.join(program)))
    });
    if !found {
        missing_service(test, &format!("needs `{program}` on PATH ({how})"));
    }
    found
}

/// A test cannot get what it needs: a skip note, or under CI a failure that says what is
/// missing.
pub fn missing_service(test: &str, why: &str) {
    assert!(
        !in_ci(),
        "{test}: {why}, and CI=true: a CI run must not skip it"
    );
    eprintln!("{test}: skipped: {why}");
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The environment is process-wide: one test sets and checks every case in turn.
    #[test]
    fn variables_are_returned_in_order_and_missing_ones_skip_or_fail_under_ci() {
        const SERVICE: Service = Service {
            name: "Thing",
            vars: &["PICO_TESTKIT_A", "PICO_TESTKIT_B"],
            how: "start it",
        };
        std::env::set_var("PICO_TESTKIT_A", "a");
        std::env::set_var("PICO_TESTKIT_B", "b");
        assert_eq!(
            require("t", &SERVICE),
            Some(vec!["a".to_string(), "b".to_string()])
        );

        std::env::set_var("PICO_TESTKIT_B", "");
        std::env::set_var("CI", "false");
        assert_eq!(require("t", &SERVICE), None);
        assert!(!require_program("t", "pico-testkit-no-such-program", "x"));
        assert!(require_program("t", "sh", "x"));

        std::env::set_var("CI", "true");
        let failed = std::panic::catch_unwind(|| require("t", &SERVICE)).unwrap_err();
        let message = failed.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("needs Thing (PICO_TESTKIT_B unset; start it)"),
            "{message}"
        );
        assert!(std::panic::catch_unwind(|| require_program("t", "pico-testkit-no", "x")).is_err());
        std::env::remove_var("CI");
    }
}
pub mod consumer;
pub mod garage;
pub mod history;
pub mod lifecycle;
pub mod netns;
pub mod pg_proxy;
