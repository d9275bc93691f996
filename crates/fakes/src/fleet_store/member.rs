//! [`FleetMember`]'s side of the store contract: what one simulated host's store answers and
//! writes, over the [`Fleet`]'s shared state.

use super::*;

#[async_trait]
impl BindingStore for FleetMember {
    fn status(&self) -> StoreStatus {
        let s = self.lock();
        let since = s
            .members
            .get(&self.host_id)
            .and_then(|m| m.unreachable.as_ref().map(|(t, _)| *t));
        StoreStatus {
            kind: "etcd",
            host_id: self.host_id.clone(),
            connected: since.is_none(),
            unreachable_since_ms: since,
            last_error: since.map(|_| "connection refused (test)".to_string()),
            location: "fleet (in-memory test store)".into(),
            refused_values: 0,
            integrity_required: false,
        }
    }

    fn host_id(&self) -> &str {
        &self.host_id
    }

    fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError> {
        let s = self.lock();
        Ok(s.view(&self.host_id).bindings.values().cloned().collect())
    }

    fn get_binding(&self, name: &str) -> Result<Option<StoredBinding>, StoreError> {
        let s = self.lock();
        Ok(s.view(&self.host_id).bindings.get(name).cloned())
    }

    async fn insert_binding(&self, b: &BindingRecord) -> Result<(), StoreError> {
        let mut s = self.lock();
        s.check(&self.host_id)?;
        if s.data.bindings.contains_key(&b.name) {
            return Err(StoreError::Duplicate(b.name.clone()));
        }
        let t = s.tick_ms();
        s.data.bindings.insert(
            b.name.clone(),
            StoredBinding {
                binding: b.clone(),
                created_at_ms: t,
                updated_at_ms: t,
            },
        );
        s.tell_others(&self.host_id, StoreEvent::Binding(b.name.clone()));
        Ok(())
    }

    async fn upsert_bindings_from(
        &self,
        list: &[(BindingRecord, Option<BindingRecord>)],
    ) -> Result<Vec<Upsert>, StoreError> {
        let mut s = self.lock();
        s.check(&self.host_id)?;
        for (b, base) in list {
            let held = s.data.bindings.get(&b.name).map(|sb| &sb.binding);
            if base.is_some() && held != base.as_ref() {
                return Err(StoreError::Conflict(b.name.clone()));
            }
        }
        let mut out = Vec::with_capacity(list.len());
        for (b, _) in list {
            let t = s.tick_ms();
            let u = match s.data.bindings.get_mut(&b.name) {
                Some(sb) if sb.binding == *b => Upsert::Unchanged,
                Some(sb) => {
                    sb.binding = b.clone();
                    sb.updated_at_ms = t;
                    Upsert::Updated
                }
                None => {
                    s.data.bindings.insert(
                        b.name.clone(),
                        StoredBinding {
                            binding: b.clone(),
                            created_at_ms: t,
                            updated_at_ms: t,
                        },
                    );
                    Upsert::Created
                }
            };
            if u != Upsert::Unchanged {
                s.tell_others(&self.host_id, StoreEvent::Binding(b.name.clone()));
            }
            out.push(u);
        }
        Ok(out)
    }

    async fn remove_binding(&self, name: &str) -> Result<bool, StoreError> {
        let mut s = self.lock();
        s.check(&self.host_id)?;
        let had = s.data.bindings.remove(name).is_some();
        s.data.targets.remove(name);
        s.data.outcomes.remove(name);
        s.data.claims.remove(name);
        for m in s.members.values_mut() {
            m.history.remove(name);
        }
        if had {
            s.tell_others(&self.host_id, StoreEvent::Binding(name.to_string()));
        }
        Ok(had)
    }

    async fn record_outcomes(&self, list: &[(String, OutcomeRecord)]) -> Result<(), StoreError> {
        let mut s = self.lock();
        let known: Vec<bool> = list
            .iter()
            .map(|(n, _)| s.view(&self.host_id).bindings.contains_key(n))
            .collect();
        let Some(m) = s.members.get_mut(&self.host_id) else {
            return Ok(());
        };
        for ((name, o), known) in list.iter().zip(known) {
            if known {
                let h = m.history.entry(name.clone()).or_default();
                h.insert(0, o.clone());
                h.truncate(HISTORY);
            }
        }
        Ok(())
    }

    fn recent_outcomes(&self, name: &str, limit: usize) -> Result<Vec<OutcomeRecord>, StoreError> {
        let s = self.lock();
        Ok(s.members
            .get(&self.host_id)
            .and_then(|m| m.history.get(name))
            .map(|h| h.iter().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    fn last_outcomes(&self) -> Result<HashMap<String, OutcomeRecord>, StoreError> {
        let s = self.lock();
        Ok(s.members
            .get(&self.host_id)
            .map(|m| {
                m.history
                    .iter()
                    .filter_map(|(n, h)| h.first().map(|o| (n.clone(), o.clone())))
                    .collect()
            })
            .unwrap_or_default())
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        let s = self.lock();
        match s.members.get(&self.host_id) {
            Some(m) => m.events.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    async fn claim_resolver(&self, name: &str) -> Result<bool, StoreError> {
        let mut s = self.lock();
        *s.claims_asked.entry(self.host_id.clone()).or_default() += 1;
        s.check(&self.host_id)?;
        if !s.data.bindings.contains_key(name) {
            return Ok(false);
        }
        let holder = s.data.claims.get(name).cloned();
        match holder {
            Some(h) if h == self.host_id => Ok(true),
            Some(h) if s.usable(&h) => Ok(false),
            _ => {
                let fallback = s.fallback;
                let since = *s
                    .unclaimed_since
                    .entry(name.to_string())
                    .or_insert_with(Instant::now);
                let preferred = s.preferred(name);
                if preferred.as_deref() == Some(self.host_id.as_str())
                    || since.elapsed() >= fallback
                {
                    s.data.claims.insert(name.to_string(), self.host_id.clone());
                    s.unclaimed_since.remove(name);
                    Ok(true)
                } else {
                    Ok(false)
                }
            }
        }
    }

    async fn publish_targets(&self, name: &str, set: &TargetSet) -> Result<(), StoreError> {
        let mut s = self.lock();
        s.check(&self.host_id)?;
        if !s.data.bindings.contains_key(name) {
            return Err(StoreError::NotFound(name.to_string()));
        }
        if let Some(old) = s.data.targets.get(name) {
            if old.targets == set.targets
                && old.dropped == set.dropped
                && old.ttl_seconds == set.ttl_seconds
                && old.binding_updated_at_ms == set.binding_updated_at_ms
            {
                return Ok(());
            }
        }
        s.generation += 1;
        let mut set = set.clone();
        set.resolved_by = self.host_id.clone();
        set.generation = s.generation;
        s.data.targets.insert(name.to_string(), set);
        s.tell_others(&self.host_id, StoreEvent::Targets(name.to_string()));
        Ok(())
    }

    fn published_targets(&self, name: &str) -> Option<TargetSet> {
        let s = self.lock();
        s.view(&self.host_id).targets.get(name).cloned()
    }

    async fn publish_host_outcome(
        &self,
        name: &str,
        outcome: &HostOutcome,
    ) -> Result<(), StoreError> {
        let mut s = self.lock();
        let mut o = outcome.clone();
        o.host = self.host_id.clone();
        if !s.usable(&self.host_id) {
            if let Some(m) = s.members.get_mut(&self.host_id) {
                m.pending.insert(name.to_string(), o);
            }
            return Ok(());
        }
        if !s.data.bindings.contains_key(name) {
            return Ok(());
        }
        s.data
            .outcomes
            .entry(name.to_string())
            .or_default()
            .insert(self.host_id.clone(), o);
        s.tell_others(&self.host_id, StoreEvent::Fleet(name.to_string()));
        Ok(())
    }

    fn fleet_view(&self, name: &str) -> FleetView {
        let s = self.lock();
        let d = s.view(&self.host_id);
        let mut hosts: Vec<FleetHost> = d
            .outcomes
            .get(name)
            .map(|m| {
                m.values()
                    .map(|o| FleetHost {
                        outcome: o.clone(),
                        alive: s.members.get(&o.host).is_some_and(|m| m.alive),
                    })
                    .collect()
            })
            .unwrap_or_default();
        // A member cut off from the store knows its own newest state.
        if let Some(p) = s
            .members
            .get(&self.host_id)
            .and_then(|m| m.pending.get(name))
        {
            hosts.retain(|h| h.outcome.host != self.host_id);
            hosts.push(FleetHost {
                outcome: p.clone(),
                alive: true,
            });
            hosts.sort_by(|a, b| a.outcome.host.cmp(&b.outcome.host));
        }
        FleetView {
            resolver: d.claims.get(name).cloned(),
            generation: d.targets.get(name).map_or(0, |t| t.generation),
            hosts,
        }
    }
}
