//! How a Postgres client error becomes a message: the error with its causes, and what we were
//! doing when it happened.

use crate::MetaError;

/// A client error with its causes: `postgres::Error`'s own text is only the kind ("db error"),
/// the server's message is its source.
pub(super) fn describe(error: &postgres::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub(super) fn failed(doing: &str) -> impl Fn(postgres::Error) -> String + '_ {
    move |error| format!("{doing}: {}", describe(&error))
}

/// Wraps a client error with what we were doing, for [`MetaError::Storage`] (or
/// [`MetaError::OutOfSpace`] for a server whose disk is full).
pub(super) fn storage(doing: &str) -> impl Fn(postgres::Error) -> MetaError + '_ {
    move |error| pg_error(&error).doing(doing)
}

/// A client error as a [`MetaError`]: the server's `disk_full` (SQLSTATE 53100) is
/// [`MetaError::OutOfSpace`], anything else [`MetaError::Storage`].
pub(super) fn pg_error(error: &postgres::Error) -> MetaError {
    if error.code() == Some(&postgres::error::SqlState::DISK_FULL) {
        MetaError::OutOfSpace(describe(error))
    } else {
        MetaError::Storage(describe(error))
    }
}
