//! The recorder task: writes outcomes to the store in one transaction per burst.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tributary_store::{BindingStore, OutcomeRecord};

pub(crate) enum RecordMsg {
    /// Boxed: an outcome is large next to a flush request.
    Outcome(String, Box<OutcomeRecord>),
    Flush(oneshot::Sender<()>),
}

pub(crate) async fn record_task(
    store: Arc<dyn BindingStore>,
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
            if let Err(e) = store.record_outcomes(&batch).await {
                tracing::error!(error = %e, "recording outcomes failed");
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}
