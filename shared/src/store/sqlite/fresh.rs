//! What a publish just wrote, kept so that a delivery's first try does not read it back.
//!
//! The embedded shape is the only writer of its database, so this copy can be exact. The
//! store thread updates it right after each commit, in commit order: a publish adds its
//! deliveries (with their event), an attempt takes its delivery out, and every other write
//! forgets everything. Endpoints are kept from reads; a generation number, bumped by each
//! forget, keeps a read that overlapped a write from adding what that write changed.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use crate::{
    domain::{Delivery, DeliveryId, Endpoint, EndpointId, Event},
    store::DeliveryWork,
};

/// Deliveries kept at most; past this, first tries read from the database as before. Work
/// is taken oldest first, so the first ones kept are the next needed. W1 takes up to a
/// second from publish to first try at over 10,000 deliveries a second: a cap of 8,192
/// cost it a tenth of its rate.
const MAX_DELIVERIES: usize = 32_768;
/// Endpoints kept at most; past this, the endpoint copies start over.
const MAX_ENDPOINTS: usize = 4_096;

#[derive(Default)]
pub(super) struct FreshWork {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: u64,
    deliveries: HashMap<DeliveryId, (Delivery, Arc<Event>)>,
    endpoints: HashMap<EndpointId, Endpoint>,
}

impl FreshWork {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Taken before a write or read whose result may be kept.
    pub(super) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Keeps a committed publish's deliveries. Called on the store thread right after the
    /// commit, so no later write can have changed them yet. Deliveries to an endpoint known
    /// to be failing are not kept: their first tries wait behind its backlog, and during an
    /// outage their copies filled the cache (some 17 MB) for nothing.
    pub(super) fn remember_published(&self, event: &Event, deliveries: &[Delivery]) {
        let mut inner = self.lock();
        let event = Arc::new(event.clone());
        for delivery in deliveries {
            let failing = inner
                .endpoints
                .get(&delivery.endpoint_id)
                .is_some_and(|endpoint| endpoint.failing_since.is_some());
            if failing {
                continue;
            }
            if inner.deliveries.len() >= MAX_DELIVERIES {
                break;
            }
            inner
                .deliveries
                .insert(delivery.id.clone(), (delivery.clone(), Arc::clone(&event)));
        }
    }

    /// Keeps an endpoint read from the database, unless a write ended since `generation`.
    pub(super) fn remember_endpoint(&self, generation: u64, endpoint: &Endpoint) {
        let mut inner = self.lock();
        if inner.generation != generation {
            return;
        }
        if inner.endpoints.len() >= MAX_ENDPOINTS {
            inner.endpoints.clear();
        }
        inner
            .endpoints
            .insert(endpoint.id.clone(), endpoint.clone());
    }

    /// The work of a delivery published since the last write, taken out; `None` when it
    /// has to be read (not kept, or its endpoint is not known).
    pub(super) fn take(&self, id: &DeliveryId) -> Option<DeliveryWork> {
        let mut inner = self.lock();
        let (delivery, event) = inner.deliveries.remove(id)?;
        let endpoint = inner.endpoints.get(&delivery.endpoint_id)?.clone();
        Some(DeliveryWork {
            delivery,
            event: Some(Event::clone(&event)),
            endpoint: Some(endpoint),
        })
    }

    pub(super) fn forget_delivery(&self, id: &DeliveryId) {
        self.lock().deliveries.remove(id);
    }

    /// After any write other than a publish or an attempt: nothing kept can be trusted.
    pub(super) fn forget_all(&self) {
        let mut inner = self.lock();
        inner.generation += 1;
        // A new map, not a cleared one: a cleared map keeps its table (megabytes when full).
        inner.deliveries = HashMap::new();
        inner.endpoints.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, delivery, endpoint, event};

    /// Publishes `count` events of one delivery each to `ep_1`, numbered from `first`.
    fn publish(fresh: &FreshWork, first: usize, count: usize) -> Vec<DeliveryId> {
        let receiver = endpoint("acme", "ep_1", at(0));
        (first..first + count)
            .map(|n| {
                let published = event("acme", &format!("evt_{n}"), at(1));
                let one = delivery(&published, &receiver, at(1));
                fresh.remember_published(&published, std::slice::from_ref(&one));
                one.id
            })
            .collect()
    }

    #[test]
    fn deliveries_to_an_endpoint_known_to_be_failing_are_not_kept() {
        let fresh = FreshWork::default();
        let failing = Endpoint {
            failing_since: Some(at(0)),
            ..endpoint("acme", "ep_1", at(0))
        };
        fresh.remember_endpoint(fresh.generation(), &failing);
        let ids = publish(&fresh, 0, 3);
        assert!(ids.iter().all(|id| fresh.take(id).is_none()));
        let healthy = endpoint("acme", "ep_1", at(0));
        fresh.forget_all();
        fresh.remember_endpoint(fresh.generation(), &healthy);
        let ids = publish(&fresh, 3, 3);
        assert!(ids.iter().all(|id| fresh.take(id).is_some()));
    }

    #[test]
    fn a_write_other_than_a_publish_or_an_attempt_forgets_every_delivery() {
        let fresh = FreshWork::default();
        fresh.remember_endpoint(fresh.generation(), &endpoint("acme", "ep_1", at(0)));
        let ids = publish(&fresh, 0, MAX_DELIVERIES + 1);
        assert_eq!(
            fresh.lock().deliveries.len(),
            MAX_DELIVERIES,
            "kept up to the cap"
        );
        fresh.forget_all();
        assert!(ids.iter().all(|id| fresh.take(id).is_none()));
        assert_eq!(
            fresh.lock().deliveries.capacity(),
            0,
            "its memory is given back"
        );
    }
}
