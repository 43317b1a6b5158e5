//! The process's signals: SIGINT and SIGTERM stop the node, SIGHUP reloads the token file, a
//! second stop signal while stopping exits at once. Only the main thread ever takes them.

use std::sync::Arc;

use pico_proto::header::PICO_SIGNALS;

use super::error::StartError;
use crate::auth::SharedTokens;

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread and every thread it starts, so `sigwait`
/// here receives them.
pub(super) fn block_shutdown_signals() -> Result<libc::sigset_t, StartError> {
    // SAFETY: plain signal-set manipulation on a zeroed, then initialised, set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(StartError::BlockSignals);
        }
        Ok(set)
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut signal = 0;
    // SAFETY: `set` was initialised by `block_shutdown_signals`; sigwait writes one int.
    unsafe {
        libc::sigwait(set, &mut signal);
    }
    signal
}

/// Waits for SIGINT or SIGTERM; each SIGHUP meanwhile reloads the token file.
pub(super) fn wait_for_stop(signals: &libc::sigset_t, auth: Option<&Arc<SharedTokens>>) {
    while wait_for_signal(signals) == libc::SIGHUP {
        match auth {
            Some(tokens) => match tokens.reload() {
                Ok(count) => log::info!("SIGHUP: reloaded {count} token grants"),
                Err(e) => log::error!("SIGHUP: kept the previous tokens: {e}"),
            },
            None => log::info!("SIGHUP: nothing to reload (--auth off)"),
        }
    }
}

/// A second SIGINT/SIGTERM while stopping means "now".
pub(super) fn exit_on_second_stop(signals: libc::sigset_t) -> Result<(), StartError> {
    std::thread::Builder::new()
        .name(PICO_SIGNALS.into())
        .spawn(move || loop {
            let signal = wait_for_signal(&signals);
            if signal != libc::SIGHUP {
                log::error!("second stop signal: exiting without finishing the shutdown");
                std::process::exit(1);
            }
        })
        .map(drop)
        .map_err(StartError::SignalThread)
}
