//! Requests of people: create, replace, remove, refresh, and the views of bindings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tributary_apply::RemoveOutcome;
use tributary_store::{BindingRecord, OutcomeRecord, Upsert};

use super::apply::reload_cause_text;
use super::{lock, ApplyMsg, Engine, EngineError, Slot};
use crate::view::{BindingDetail, BindingInput, BindingView, BulkItem, RemoveResponse};

impl Engine {
    /// Creates a binding; fails if the name is taken.
    pub async fn add(&self, input: &BindingInput) -> Result<BindingView, EngineError> {
        let _admin = self.inner.admin.lock().await;
        let (binding, record) = self.prepare(input, None, None)?;
        if lock(&self.inner.slots).contains_key(&record.name) {
            return Err(EngineError::Duplicate(record.name));
        }
        let taken = lock(&self.inner.slots)
            .keys()
            .find(|k| k.eq_ignore_ascii_case(&record.name))
            .cloned();
        if let Some(taken) = taken {
            return Err(case_clash(&taken, &record.name));
        }
        self.inner
            .store
            .insert_binding(&record)
            .await
            .map_err(|e| match e {
                tributary_store::StoreError::Duplicate(n) => EngineError::Duplicate(n),
                e => e.into(),
            })?;
        let updated_at_ms = self.updated_at(&record.name);
        let slot = self.new_slot(binding, record, updated_at_ms);
        self.spawn(&slot);
        Ok(self.view_of(&slot))
    }

    /// Creates or replaces the binding `name`.
    pub async fn put(
        &self,
        name: &str,
        input: &BindingInput,
    ) -> Result<(Upsert, BindingView), EngineError> {
        let _admin = self.inner.admin.lock().await;
        let results = self.put_many_locked(&[(Some(name), input)]).await?;
        let (upsert, slot) = results.into_iter().next().expect("one result per input");
        Ok((upsert, self.view_of(&slot)))
    }

    /// Creates or replaces many bindings in one store transaction; every changed binding resolves
    /// right away, so their changes are applied together. All inputs are validated first: one
    /// bad input changes nothing.
    pub async fn put_many(&self, inputs: &[BindingInput]) -> Result<Vec<BulkItem>, EngineError> {
        let _admin = self.inner.admin.lock().await;
        let mut seen: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
        for i in inputs {
            match seen.insert(i.name.to_ascii_lowercase(), i.name.as_str()) {
                Some(other) if other == i.name => {
                    return Err(EngineError::invalid(
                        "name",
                        format!("binding {:?} appears twice", i.name),
                    ))
                }
                Some(other) => {
                    return Err(EngineError::invalid(
                        "name",
                        format!(
                            "bindings {other:?} and {:?} differ only in case: upstream names are unique regardless of case (nginx compares them so)",
                            i.name
                        ),
                    ))
                }
                None => {}
            }
        }
        let list: Vec<(Option<&str>, &BindingInput)> = inputs.iter().map(|i| (None, i)).collect();
        let results = self.put_many_locked(&list).await?;
        Ok(results
            .into_iter()
            .map(|(u, slot)| BulkItem {
                name: lock(&slot.state).record.name.clone(),
                result: upsert_str(u).to_string(),
            })
            .collect())
    }

    async fn put_many_locked(
        &self,
        inputs: &[(Option<&str>, &BindingInput)],
    ) -> Result<Vec<(Upsert, Arc<Slot>)>, EngineError> {
        let mut prepared = Vec::with_capacity(inputs.len());
        // Existing names by their lower-case form: a new name may not differ only in case.
        let by_lower: std::collections::HashMap<String, String> = lock(&self.inner.slots)
            .keys()
            .map(|k| (k.to_ascii_lowercase(), k.clone()))
            .collect();
        for (path_name, input) in inputs {
            let name = path_name.unwrap_or(&input.name);
            if let Some(taken) = by_lower.get(&name.to_ascii_lowercase()) {
                if taken != name {
                    return Err(case_clash(taken, name));
                }
            }
            let previous = lock(&self.inner.slots)
                .get(name)
                .map(|s| lock(&s.state).record.clone());
            let (binding, record) =
                self.prepare(input, *path_name, previous.as_ref())
                    .map_err(|e| match e {
                        EngineError::Invalid(mut errors) if inputs.len() > 1 => {
                            for e in &mut errors {
                                e.message = format!("binding {name:?}: {}", e.message);
                            }
                            EngineError::Invalid(errors)
                        }
                        e => e,
                    })?;
            prepared.push((binding, record, previous));
        }
        // Each written only over the record it was prepared from (secrets carried over from
        // it): a copy that lags a change made on another host is refused, not written over it.
        let records: Vec<(BindingRecord, Option<BindingRecord>)> = prepared
            .iter()
            .map(|(_, r, previous)| (r.clone(), previous.clone()))
            .collect();
        let upserts = self.inner.store.upsert_bindings_from(&records).await?;
        let mut out = Vec::with_capacity(prepared.len());
        for ((binding, record, _), upsert) in prepared.into_iter().zip(upserts) {
            let existing = lock(&self.inner.slots).get(&record.name).cloned();
            let slot = match (existing, upsert) {
                (Some(slot), Upsert::Unchanged) => slot,
                (Some(slot), _) => {
                    let updated_at_ms = self.updated_at(&record.name);
                    {
                        let mut st = lock(&slot.state);
                        st.binding = Arc::new(binding);
                        st.record = record;
                        st.updated_at_ms = updated_at_ms;
                    }
                    self.spawn(&slot);
                    slot
                }
                (None, _) => {
                    let updated_at_ms = self.updated_at(&record.name);
                    let slot = self.new_slot(binding, record, updated_at_ms);
                    self.spawn(&slot);
                    slot
                }
            };
            out.push((upsert, slot));
        }
        Ok(out)
    }

    /// The stored binding's `updated_at_ms` (read your writes: right after a save, the saved one).
    pub(crate) fn updated_at(&self, name: &str) -> i64 {
        match self.inner.store.get_binding(name) {
            Ok(Some(sb)) => sb.updated_at_ms,
            Ok(None) => 0,
            Err(e) => {
                tracing::warn!(binding = %name, error = %e, "reading the stored binding failed");
                0
            }
        }
    }

    /// Removes a binding: its file is deleted only if nginx still passes the test without it;
    /// otherwise nothing changes and the error says to remove the include line first.
    pub async fn remove(&self, name: &str) -> Result<RemoveResponse, EngineError> {
        let _admin = self.inner.admin.lock().await;
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let uname = lock(&slot.state).binding.name.clone();
        // The removal must reach the store (every host): refused before anything changes here
        // while the store is unreachable.
        let status = self.inner.store.status();
        if !status.connected {
            return Err(tributary_store::StoreError::Unavailable {
                store: format!("{} {}", status.kind, status.location),
                why: status
                    .last_error
                    .unwrap_or_else(|| "not connected".to_string()),
            }
            .into());
        }
        // Stop refreshing first, so no change of this binding is queued after the removal.
        if let Some(t) = lock(&slot.state).task.take() {
            t.abort();
        }
        let (tx, rx) = oneshot::channel();
        self.inner
            .apply_tx
            .send(ApplyMsg::Remove(uname, tx))
            .map_err(|_| EngineError::ShuttingDown)?;
        let res = rx.await.map_err(|_| EngineError::ShuttingDown)?;
        let file_removed = match res {
            Ok(outcome) => match removed_file(&outcome) {
                Ok(removed) => removed,
                Err(e) => {
                    self.spawn(&slot);
                    return Err(e);
                }
            },
            Err(e) => {
                self.spawn(&slot);
                return Err(EngineError::Conflict(e.to_string()));
            }
        };
        if let Err(e) = self.inner.store.remove_binding(name).await {
            // Still stored (on every host): the binding goes on here too, and its file comes
            // back with its next apply.
            self.spawn(&slot);
            return Err(e.into());
        }
        lock(&self.inner.slots).remove(name);
        Ok(RemoveResponse {
            name: name.to_string(),
            file_removed,
        })
    }

    /// Resolves the binding now and returns the outcome of that resolution.
    pub async fn refresh(&self, name: &str) -> Result<OutcomeRecord, EngineError> {
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let mut rx = slot.seq.subscribe();
        let start = *rx.borrow_and_update();
        // A resolution already running started before this request: wait for the next one.
        let wanted = if lock(&slot.state).running {
            start + 2
        } else {
            start + 1
        };
        slot.wake.notify_one();
        self.wait_seq(name, &slot, rx, wanted).await
    }

    /// Waits for the first outcome of the binding's current task (started by the last save).
    pub async fn wait_first(&self, name: &str) -> Result<OutcomeRecord, EngineError> {
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let rx = slot.seq.subscribe();
        let wanted = lock(&slot.state).spawn_seq + 1;
        self.wait_seq(name, &slot, rx, wanted).await
    }

    async fn wait_seq(
        &self,
        name: &str,
        slot: &Slot,
        mut rx: watch::Receiver<u64>,
        wanted: u64,
    ) -> Result<OutcomeRecord, EngineError> {
        let wait = async {
            while *rx.borrow_and_update() < wanted {
                if rx.changed().await.is_err() {
                    return Err(EngineError::ShuttingDown);
                }
            }
            Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(120), wait).await {
            Ok(Ok(())) => {
                let last = lock(&slot.state).last.clone();
                // The outcome is in the store's history before the caller hears of it (a page
                // shown right after a refresh lists it).
                self.flush_records().await;
                last.ok_or(EngineError::ShuttingDown)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EngineError::Timeout(name.to_string())),
        }
    }

    /// The store's connection state.
    pub fn store_status(&self) -> crate::view::StoreView {
        self.inner.store.status().into()
    }

    /// Values from the store this host refused since it started (docs/fleet.md "Integrity").
    pub fn store_refused_values(&self) -> u64 {
        self.inner.store.status().refused_values
    }

    /// All bindings, by name.
    pub fn list(&self) -> Vec<BindingView> {
        let mut slots: Vec<(String, Arc<Slot>)> = lock(&self.inner.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        slots.iter().map(|(_, s)| self.view_of(s)).collect()
    }

    /// One binding with its recent history.
    pub fn show(&self, name: &str) -> Result<BindingDetail, EngineError> {
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let history = self
            .inner
            .store
            .recent_outcomes(name, self.inner.opts.history_limit)?;
        Ok(BindingDetail {
            binding: self.view_of(&slot),
            history,
        })
    }

    /// The binding's view, if it exists.
    pub fn get(&self, name: &str) -> Option<BindingView> {
        let slot = lock(&self.inner.slots).get(name).cloned()?;
        Some(self.view_of(&slot))
    }

    fn view_of(&self, slot: &Slot) -> BindingView {
        let st = lock(&slot.state);
        let rec = &st.record;
        let decl = self.inner.host.provider(&rec.plugin, &rec.provider);
        let mut config = BTreeMap::new();
        let mut secrets = BTreeMap::new();
        if let Some(decl) = &decl {
            for f in decl.configuration.fields.iter().filter(|f| f.secret) {
                secrets.insert(f.key.clone(), rec.config.contains_key(&f.key));
            }
        }
        for (k, v) in &rec.config {
            // Without the provider's declaration every field is treated as secret.
            let secret = decl
                .as_ref()
                .and_then(|d| d.field(k))
                .is_none_or(|f| f.secret);
            if secret {
                secrets.insert(k.clone(), true);
            } else {
                config.insert(k.clone(), v.clone());
            }
        }
        BindingView {
            name: rec.name.clone(),
            plugin: rec.plugin.clone(),
            provider: rec.provider.clone(),
            service: rec.service.clone(),
            interval_secs: rec.interval_secs,
            directives: rec.directives.clone(),
            probe: rec.probe.clone(),
            drain_secs: rec.drain_secs,
            config,
            secrets,
            include_line: st.binding.include_line(),
            file: self
                .inner
                .opts
                .conf_dir
                .join("upstreams")
                .join(format!("{}.conf", rec.name))
                .display()
                .to_string(),
            last_outcome: st.last.clone(),
            servers: st.servers.clone(),
            next_refresh_ms: st.next_ms,
            consecutive_failures: st.failures,
            fleet: super::fleet_admin::binding_fleet(&self.inner, &rec.name, st.resolved_ok_ms),
        }
    }
}

/// `name` differs from the existing binding `taken` only in case.
fn case_clash(taken: &str, name: &str) -> EngineError {
    EngineError::Conflict(format!(
        "a binding named {taken:?} already exists: upstream names are unique regardless of case (nginx compares them so), so {name:?} cannot be added; use {taken:?} to change that binding"
    ))
}

fn upsert_str(u: Upsert) -> &'static str {
    match u {
        Upsert::Created => "created",
        Upsert::Updated => "updated",
        Upsert::Unchanged => "unchanged",
    }
}

/// `Ok(file_removed)` when the binding may go, a [`EngineError::Conflict`] saying why when the
/// file had to stay.
fn removed_file(outcome: &RemoveOutcome) -> Result<bool, EngineError> {
    match outcome {
        RemoveOutcome::Removed => Ok(true),
        RemoveOutcome::NotFound => Ok(false),
        RemoveOutcome::Refused { nginx_error } => Err(EngineError::Conflict(format!(
            "nginx -t fails without this upstream's file, so the binding and its file were \
             kept: {}",
            nginx_error.trim()
        ))),
        RemoveOutcome::ReloadFailed { cause, error } => Err(EngineError::Conflict(format!(
            "nginx reload failed ({}) after removing the file, so the binding and its file were \
             kept: {}",
            reload_cause_text(*cause),
            error.trim()
        ))),
        RemoveOutcome::RestoreFailed { cause, error } => Err(EngineError::Conflict(format!(
            "removing the file failed ({}) and it could not be put back ({}); the binding was \
             kept and the restore is retried",
            cause.trim(),
            error.trim()
        ))),
    }
}
