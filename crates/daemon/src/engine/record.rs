//! The recorder task: writes outcomes to the store in one transaction per burst.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tributary_store::{OutcomeRecord, Store};

use super::lock;

pub(crate) enum RecordMsg {
    /// Boxed: an outcome is large next to a flush request.
    Outcome(String, Box<OutcomeRecord>),
    Flush(oneshot::Sender<()>),
}

pub(crate) async fn record_task(
    store: Arc<Mutex<Store>>,
    mut rx: mpsc::UnboundedReceiver<RecordMsg>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                RecordMsg::Outcome(n, o) => batch.push((n, *o)),
                RecordMsg::Flush(tx) => flushes.push(tx),
            }
            if batch.len() < 2000 {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            let store = store.clone();
            let res =
                tokio::task::spawn_blocking(move || lock(&store).record_outcomes(&batch)).await;
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "recording outcomes failed"),
                Err(e) => tracing::error!(error = %e, "recording outcomes panicked"),
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}
