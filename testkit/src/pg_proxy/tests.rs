//! Tests of the fault proxy's wire parsing and its faults.

use super::*;

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

#[test]
fn messages_are_cut_at_their_length_and_a_partial_one_waits() {
    let mut bytes = message(b'Q', b"COMMIT\0");
    bytes.extend(message(b'S', b""));
    let first = next_message(&bytes).unwrap().unwrap();
    assert_eq!(
        (first.kind, first.body, first.len),
        (b'Q', &b"COMMIT\0"[..], 12)
    );
    assert_eq!(whole_messages(&bytes).unwrap(), 17);
    assert_eq!(whole_messages(&bytes[..16]).unwrap(), 12);
    assert_eq!(whole_messages(&bytes[..4]).unwrap(), 0);
    assert_eq!(next_message(&bytes[..11]).unwrap(), None);

    let too_short = [b'Q', 0, 0, 0, 3];
    assert!(next_message(&too_short).is_err());
    let too_long = [b'Q', 0x7f, 0xff, 0xff, 0xff];
    let error = next_message(&too_long).unwrap_err().to_string();
    assert!(error.contains("forwards at most"), "{error}");
}

#[test]
fn a_query_commits_when_its_last_statement_does() {
    for sql in [
        "COMMIT",
        "commit;",
        " END ",
        "COMMIT WORK",
        "UPDATE t SET a = 1; COMMIT",
    ] {
        assert!(ends_with_commit(sql), "{sql}");
    }
    for sql in [
        "BEGIN",
        "ROLLBACK",
        "COMMIT; BEGIN",
        "SELECT commit FROM t",
        "RELEASE SAVEPOINT command",
        "",
        ";",
    ] {
        assert!(!ends_with_commit(sql), "{sql}");
    }
}

#[test]
fn an_executed_portal_runs_its_statements_text() {
    let mut names = Names::default();
    let executed = |names: &Names, body: &[u8]| names.executed(body).map(|s| s.to_string());
    names.parse(b"\0COMMIT\0\0\0");
    names.parse(b"s1\0SELECT 1\0\0\0");
    names.bind(b"\0\0\0\0\0\0\0\0");
    assert_eq!(executed(&names, b"\0\0\0\0\0").as_deref(), Some("COMMIT"));
    names.bind(b"p1\0s1\0\0\0");
    assert_eq!(
        executed(&names, b"p1\0\0\0\0\0").as_deref(),
        Some("SELECT 1")
    );
    // The unnamed statement replaced: the unnamed portal bound again runs the new one.
    names.parse(b"\0SELECT 2\0\0\0");
    names.bind(b"\0\0\0\0");
    assert_eq!(executed(&names, b"\0\0\0\0\0").as_deref(), Some("SELECT 2"));
    // A closed portal, a portal bound to an unknown statement: unknown.
    names.parse(b"c\0END\0\0\0");
    names.bind(b"pc\0c\0");
    assert_eq!(executed(&names, b"pc\0\0\0\0\0").as_deref(), Some("END"));
    names.close(b"Ppc\0");
    assert_eq!(executed(&names, b"pc\0\0\0\0\0"), None);
    names.bind(b"p1\0nope\0");
    assert_eq!(executed(&names, b"p1\0"), None);
    // A truncated Bind changes nothing.
    names.bind(b"");
    assert_eq!(executed(&names, b"").as_deref(), Some("SELECT 2"));
}

#[test]
fn a_transaction_remembers_what_it_ran_and_whether_it_rolled_back() {
    let mut ran = Ran::default();
    ran.add("DELETE FROM streams WHERE id = $1".into());
    ran.add("ROLLBACK TO SAVEPOINT command; RELEASE SAVEPOINT command".into());
    assert!(ran.contains("DELETE FROM streams"));
    assert!(!ran.contains("UPDATE nodes"));
    assert!(!ran.rolled_back);
    ran.add("rollback".into());
    assert!(ran.rolled_back);
    for i in 0..RAN_MAX + 10 {
        ran.add(format!("SELECT {i}").into());
    }
    assert_eq!(ran.statements.len(), RAN_MAX);
    assert!(ends_with_rollback("ABORT"));
    assert!(!ends_with_rollback("ROLLBACK TO command"));
}

#[test]
fn names_beyond_the_limit_are_forgotten_not_grown() {
    let mut names = Names::default();
    for i in 0..NAMES_MAX + 10 {
        names.parse(format!("s{i}\0COMMIT\0").as_bytes());
    }
    assert!(names.statements.len() <= NAMES_MAX);
    assert!(names.statements.contains_key(&b"s4105"[..]));
}

#[test]
fn the_server_of_a_url_is_replaced_and_the_rest_kept() {
    let (server, rebuild) =
        split_server("postgres://u:p@127.0.0.1:5432/picomq?connect_timeout=5").unwrap();
    assert_eq!(server, "127.0.0.1:5432");
    assert_eq!(
        rebuild("127.0.0.1:40000"),
        "postgres://u:p@127.0.0.1:40000/picomq?connect_timeout=5"
    );
    let (server, rebuild) = split_server("postgresql://localhost/db").unwrap();
    assert_eq!(server, "localhost:5432");
    assert_eq!(rebuild("127.0.0.1:1"), "postgresql://127.0.0.1:1/db");
    let (server, _) = split_server("postgres://u@[::1]:6000").unwrap();
    assert_eq!(server, "[::1]:6000");
    let (server, _) = split_server("postgres://u:p@host").unwrap();
    assert_eq!(server, "host:5432");
    assert!(split_server("host=127.0.0.1 user=u").is_err());
    assert!(split_server("postgres:///db").is_err());
    assert!(split_server("postgres://a:1,b:2/db").is_err());
}
