//! One shutdown for every process: a [`CancellationToken`] tree whose root
//! is cancelled by SIGTERM or Ctrl-C. Tasks hold child tokens
//! (`token.child_token()`) and stop when theirs is cancelled; nothing else
//! (no flags, no watch channels) says "stop".

pub use tokio_util::sync::CancellationToken;

/// A token cancelled on the first Ctrl-C or SIGTERM. Call it inside a tokio
/// runtime; the signal handlers live as long as the runtime.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        signal().await;
        tracing::info!("stop requested (signal)");
        fire.cancel();
    });
    token
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn signal() {
    let term = async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match signal(SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
