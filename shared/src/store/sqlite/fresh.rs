//! What a publish or a fan-out just wrote, kept so that a delivery's first try does not read it back,
//! and what every publish reads (its account and the account's endpoints), kept so that a
//! publish reads nothing.
//!
//! The embedded shape is the only writer of its database, so this copy can be exact. The
//! store thread updates it right after each commit, in commit order: a publish or a fan-out adds
//! its deliveries (with their event), an attempt takes its delivery out, a purge changes nothing
//! kept (it removes only ended work), and every other write (and an attempt that starts or
//! stops an endpoint's failing clock) forgets everything.
//! Accounts and endpoints are kept from reads; a generation number, bumped by each forget,
//! keeps a read that overlapped a write from adding what that write changed.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use crate::{
    domain::{Account, AccountId, Delivery, DeliveryId, Endpoint, EndpointId, Event},
    store::DeliveryWork,
};

/// Deliveries kept at most; past this, first tries read from the database as before. Work
/// is taken oldest first, so the first ones kept are the next needed. W1 takes up to a
/// second from publish to first try at over 10,000 deliveries a second: a cap of 8,192
/// cost it a tenth of its rate.
const MAX_DELIVERIES: usize = 32_768;
/// Endpoints kept at most; past this, the endpoint copies start over.
const MAX_ENDPOINTS: usize = 4_096;
/// Accounts kept at most, and endpoints in the accounts' lists, all lists together; past
/// these, those copies start over. An account whose list alone is longer is read each time.
const MAX_ACCOUNTS: usize = 4_096;
const MAX_LISTED_ENDPOINTS: usize = 8_192;

#[derive(Default)]
pub(super) struct FreshWork {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: u64,
    deliveries: HashMap<DeliveryId, (Delivery, Arc<Event>)>,
    endpoints: HashMap<EndpointId, Endpoint>,
    /// `None` for an account that does not exist (a publish to it is refused unread too).
    accounts: HashMap<AccountId, Option<Account>>,
    endpoint_lists: HashMap<AccountId, Arc<Vec<Endpoint>>>,
    /// Endpoints in `endpoint_lists`.
    listed: usize,
}

impl Inner {
    /// Makes `endpoints` known to first tries; past `MAX_ENDPOINTS` the copies start over.
    fn know_endpoints(&mut self, endpoints: &[Endpoint]) {
        if endpoints.len() > MAX_ENDPOINTS {
            return;
        }
        if self.endpoints.len() + endpoints.len() > MAX_ENDPOINTS {
            self.endpoints.clear();
        }
        for endpoint in endpoints {
            self.endpoints.insert(endpoint.id.clone(), endpoint.clone());
        }
    }
}

impl FreshWork {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Taken before a write or read whose result may be kept.
    pub(super) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Keeps a committed publish's or fan-out's deliveries. Called on the store thread right
    /// after the commit, so no later write can have changed them yet. Deliveries to an endpoint known
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
        if inner.generation == generation {
            inner.know_endpoints(std::slice::from_ref(endpoint));
        }
    }

    /// The account as last read, if nothing has changed it since: `Some(None)` when it
    /// did not exist.
    pub(super) fn account(&self, id: &AccountId) -> Option<Option<Account>> {
        self.lock().accounts.get(id).cloned()
    }

    /// Keeps an account read from the database (or that it does not exist), unless a write
    /// ended since `generation`.
    pub(super) fn remember_account(
        &self,
        generation: u64,
        id: &AccountId,
        account: Option<&Account>,
    ) {
        let mut inner = self.lock();
        if inner.generation != generation {
            return;
        }
        if inner.accounts.len() >= MAX_ACCOUNTS {
            inner.accounts.clear();
        }
        inner.accounts.insert(id.clone(), account.cloned());
    }

    /// An account's endpoints as last read, if nothing has changed them since.
    pub(super) fn endpoints_of(&self, account: &AccountId) -> Option<Arc<Vec<Endpoint>>> {
        self.lock().endpoint_lists.get(account).cloned()
    }

    /// Keeps an account's endpoints read from the database, unless a write ended since
    /// `generation`; each is then known to first tries as [`Self::remember_endpoint`] does.
    /// So right after a forget, the next publish makes its own deliveries' first tries
    /// reads-free again, and those to an endpoint known to be failing are not kept: in an
    /// outage they filled the kept deliveries, and a healthy account's first tries then
    /// queued behind the outage's reads.
    pub(super) fn remember_endpoints_of(
        &self,
        generation: u64,
        account: &AccountId,
        endpoints: Vec<Endpoint>,
    ) {
        let mut inner = self.lock();
        if inner.generation != generation || endpoints.len() > MAX_LISTED_ENDPOINTS {
            return;
        }
        if let Some(replaced) = inner.endpoint_lists.remove(account) {
            inner.listed -= replaced.len();
        }
        if inner.listed + endpoints.len() > MAX_LISTED_ENDPOINTS
            || inner.endpoint_lists.len() >= MAX_ACCOUNTS
        {
            inner.endpoint_lists.clear();
            inner.listed = 0;
        }
        inner.know_endpoints(&endpoints);
        inner.listed += endpoints.len();
        inner
            .endpoint_lists
            .insert(account.clone(), Arc::new(endpoints));
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
        inner.accounts.clear();
        inner.endpoint_lists.clear();
        inner.listed = 0;
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
    fn a_read_that_overlapped_a_write_is_not_kept() {
        let fresh = FreshWork::default();
        let acme = crate::fixtures::account("acme");
        let listed = vec![endpoint("acme", "ep_1", at(0))];
        let before = fresh.generation();
        fresh.forget_all();
        fresh.remember_account(before, &acme.id, Some(&acme));
        fresh.remember_endpoints_of(before, &acme.id, listed.clone());
        assert_eq!(fresh.account(&acme.id), None);
        assert!(fresh.endpoints_of(&acme.id).is_none());

        let now = fresh.generation();
        fresh.remember_account(now, &acme.id, Some(&acme));
        fresh.remember_endpoints_of(now, &acme.id, listed.clone());
        assert_eq!(fresh.account(&acme.id), Some(Some(acme.clone())));
        assert_eq!(fresh.endpoints_of(&acme.id).as_deref(), Some(&listed));
        fresh.forget_all();
        assert_eq!(fresh.account(&acme.id), None, "forgotten by the next write");
        assert!(fresh.endpoints_of(&acme.id).is_none());
    }

    #[test]
    fn an_accounts_endpoint_list_serves_its_first_tries() {
        let fresh = FreshWork::default();
        let failing = Endpoint {
            failing_since: Some(at(0)),
            ..endpoint("acme", "ep_1", at(0))
        };
        let healthy = endpoint("acme", "ep_2", at(0));
        fresh.remember_endpoints_of(
            fresh.generation(),
            &healthy.account_id,
            vec![failing.clone(), healthy.clone()],
        );
        let published = event("acme", "evt_1", at(1));
        let to_failing = delivery(&published, &failing, at(1));
        let to_healthy = delivery(&published, &healthy, at(1));
        fresh.remember_published(&published, &[to_failing.clone(), to_healthy.clone()]);
        assert!(
            fresh.take(&to_failing.id).is_none(),
            "not kept: its endpoint is failing"
        );
        let work = fresh
            .take(&to_healthy.id)
            .expect("kept, its endpoint known");
        assert_eq!(work.endpoint, Some(healthy));
    }

    #[test]
    fn endpoint_lists_are_kept_up_to_their_cap() {
        let fresh = FreshWork::default();
        let list = |account: &str, count: usize| -> Vec<Endpoint> {
            (0..count)
                .map(|n| endpoint(account, &format!("ep_{n}"), at(0)))
                .collect()
        };
        let (big, small) = (
            AccountId::parse("big").unwrap(),
            AccountId::parse("small").unwrap(),
        );
        fresh.remember_endpoints_of(0, &big, list("big", MAX_LISTED_ENDPOINTS + 1));
        assert!(
            fresh.endpoints_of(&big).is_none(),
            "longer than the cap alone"
        );
        fresh.remember_endpoints_of(0, &big, list("big", MAX_LISTED_ENDPOINTS - 1));
        fresh.remember_endpoints_of(0, &small, list("small", 1));
        assert!(fresh.endpoints_of(&big).is_some() && fresh.endpoints_of(&small).is_some());
        // Again, replacing its list: counted once.
        fresh.remember_endpoints_of(0, &small, list("small", 1));
        assert_eq!(fresh.lock().listed, MAX_LISTED_ENDPOINTS);
        fresh.remember_endpoints_of(0, &AccountId::parse("third").unwrap(), list("third", 1));
        assert!(
            fresh.endpoints_of(&big).is_none(),
            "past the cap, the lists start over"
        );
        assert_eq!(fresh.lock().listed, 1);
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
