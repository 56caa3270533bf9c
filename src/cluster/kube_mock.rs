//! Scenario tests of the kubernetes ledger, the reconciler and the lease against a scripted
//! API server (the kube-rs `tower-test` mock pattern). Responses are shaped like a real
//! kube-apiserver's: `Status` bodies with reasons, list `resourceVersion`s, a watch that ends
//! with an `ERROR` event carrying `410 Expired`. Time is paused: no test sleeps for real.

#[cfg(test)]
mod tests {
    use crate::test_claims as claims;

    use std::net::IpAddr;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::cluster::executor::Executor;
    use crate::cluster::lease::{Elector, LeaseSettings};
    use crate::cluster::reconcile::{Action, DropReason, Plan};
    use crate::cluster::{Caches, ClaimingPod, ClusterOptions, Reconciler, Rules};
    use http::{Request, Response};
    use http_body_util::BodyExt;
    use ip_webhook_ipam::allocator::{AllocationRequest, Allocator};
    use ip_webhook_ipam::ipset::parse_ip_spec;
    use ip_webhook_ipam::messages::Scope;
    use ip_webhook_ledger::crd::IPClaim;
    use ip_webhook_ledger::kubernetes::{rfc3339, to_resource};
    use ip_webhook_ledger::{Claim, CreateOutcome, KubeLedger, Ledger, Phase, unix_now};
    use kube::client::Body;
    use kube::runtime::events::{Recorder, Reporter};
    use kube::{Api, Client};
    use serde_json::{Value, json};

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// One expected request and the answer to give.
    struct Step {
        method: &'static str,
        /// Must equal the request path (query excluded).
        path: String,
        /// Substrings the query must contain.
        query: Vec<&'static str>,
        status: u16,
        reply: Value,
    }

    fn step(method: &'static str, path: impl Into<String>, status: u16, reply: Value) -> Step {
        Step {
            method,
            path: path.into(),
            query: vec![],
            status,
            reply,
        }
    }

    /// What the client sent.
    #[derive(Debug, Clone)]
    struct Seen {
        body: Value,
    }

    /// Answer `steps` in order, asserting each request matches; returns what was sent.
    fn script(mut handle: Handle, steps: Vec<Step>) -> tokio::task::JoinHandle<Vec<Seen>> {
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for expected in steps {
                let (request, respond) = handle.next_request().await.unwrap_or_else(|| {
                    panic!(
                        "client stopped before {} {}",
                        expected.method, expected.path
                    )
                });
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let query = request.uri().query().unwrap_or("").to_string();
                let bytes = request.into_body().collect().await.unwrap().to_bytes();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                assert_eq!(
                    (method.as_str(), path.as_str()),
                    (expected.method, expected.path.as_str()),
                    "request {} (query {query}), body {body}",
                    seen.len()
                );
                for part in &expected.query {
                    assert!(query.contains(part), "query {query:?} lacks {part:?}");
                }
                seen.push(Seen { body });
                let response = Response::builder()
                    .status(expected.status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&expected.reply).unwrap()))
                    .unwrap();
                respond.send_response(response);
            }
            seen
        })
    }

    /// A client whose requests must be `steps`, in order (each answered as its row says), and
    /// the task that answers them and returns what the client sent.
    fn scripted(steps: Vec<Step>) -> (Client, tokio::task::JoinHandle<Vec<Seen>>) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (Client::new(service, "default"), script(handle, steps))
    }

    const CLAIMS: &str = "/apis/ip-webhook.io/v1alpha1/ipclaims";

    fn status(code: u16, reason: &str, message: &str) -> Value {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
        })
    }

    fn already_exists(name: &str) -> Value {
        let mut body = status(
            409,
            "AlreadyExists",
            &format!("ipclaims.ip-webhook.io \"{name}\" already exists"),
        );
        body["details"] = json!({"name": name, "group": "ip-webhook.io", "kind": "ipclaims"});
        body
    }

    /// The object as the API server returns it: uid, resourceVersion, creationTimestamp.
    fn stored(claim: &Claim, rv: u32) -> Value {
        let mut value = serde_json::to_value(to_resource(claim)).unwrap();
        let meta = value["metadata"].as_object_mut().unwrap();
        meta.insert("uid".into(), json!(format!("uid-{}-{rv}", claim.ip)));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("creationTimestamp".into(), json!(rfc3339(claim.created_at)));
        meta.insert("generation".into(), json!(1));
        if let (Some(uid), "Bound" | "Released") = (&claim.pod.uid, phase(claim)) {
            value["spec"]["podUid"] = json!(uid);
        }
        if claim.phase != Phase::Reserved {
            value["status"] =
                json!({"phase": phase(claim), "updatedAt": rfc3339(claim.updated_at)});
        }
        value
    }

    fn phase(claim: &Claim) -> &'static str {
        match claim.phase {
            Phase::Reserved => "Reserved",
            Phase::Bound => "Bound",
            Phase::Terminating => "Terminating",
            Phase::Released => "Released",
        }
    }

    fn list(kind: &str, rv: u32, items: Vec<Value>) -> Value {
        json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}, "items": items})
    }

    #[tokio::test(start_paused = true)]
    async fn create_conflict_learns_the_holder_and_takes_the_next_ip() {
        let other = claims::builder("10.0.0.1", "web", "web-other")
            .request("req-other")
            .at(unix_now())
            .build();
        let (client, server) = scripted(vec![
            step("GET", CLAIMS, 200, list("IPClaimList", 5, vec![])),
            step("POST", CLAIMS, 409, already_exists("10.0.0.1")),
            step("GET", format!("{CLAIMS}/10.0.0.1"), 200, stored(&other, 6)),
            step(
                "POST",
                CLAIMS,
                201,
                stored(
                    &claims::builder("10.0.0.2", "web", "web-me")
                        .request("req-me")
                        .at(unix_now())
                        .build(),
                    7,
                ),
            ),
        ]);
        let ledger: Arc<dyn Ledger> = Arc::new(KubeLedger::new(client));
        let allocator = Allocator::new(ledger).await.unwrap();
        let set = parse_ip_spec("10.0.0.1-10.0.0.2").unwrap();
        let request = AllocationRequest {
            scope: Scope::App {
                namespace: "default",
                app: "web",
            },
            app: "web",
            pool: None,
            pod: claims::pod_ref("default", "web-me"),
            request_uid: "req-me",
            token: "",
            candidates: &set,
            ordinal: None,
            vm: None,
            migration: false,
            dry_run: false,
        };
        let allocation = allocator.allocate(&request).await.unwrap();
        assert_eq!(allocation.ips, vec!["10.0.0.2".parse::<IpAddr>().unwrap()]);
        let holder = allocator.holder(&"10.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(
            holder.pod.name, "web-other",
            "the 409's holder is remembered"
        );
        let seen = server.await.unwrap();
        assert_eq!(seen[1].body["metadata"]["name"], "10.0.0.1");
        assert_eq!(seen[3].body["spec"]["requestUid"], "req-me");
        assert!(
            seen[3].body.get("status").is_none(),
            "admission sends no status"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_ip_held_elsewhere_is_a_clear_denial() {
        let other = claims::builder("10.0.0.1", "web", "web-other")
            .request("req-other")
            .at(unix_now())
            .build();
        let (client, server) = scripted(vec![
            step("POST", CLAIMS, 409, already_exists("10.0.0.1")),
            step("GET", format!("{CLAIMS}/10.0.0.1"), 200, stored(&other, 6)),
        ]);
        let ledger = KubeLedger::new(client);
        let outcome = ledger
            .create(
                claims::builder("10.0.0.1", "web", "web-me")
                    .request("req-me")
                    .at(unix_now())
                    .build()
                    .into(),
            )
            .await
            .unwrap();
        match outcome {
            CreateOutcome::AlreadyHeld(holder) => assert_eq!(holder.pod.name, "web-other"),
            other => panic!("expected AlreadyHeld, got {other:?}"),
        }
        server.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_retried_admission_finds_its_own_claim() {
        let mine = claims::builder("10.0.0.3", "web", "web-me")
            .request("req-me")
            .at(unix_now())
            .build();
        let (client, server) = scripted(vec![
            step("POST", CLAIMS, 409, already_exists("10.0.0.3")),
            step("GET", format!("{CLAIMS}/10.0.0.3"), 200, stored(&mine, 6)),
        ]);
        let outcome = KubeLedger::new(client)
            .create(mine.clone().into())
            .await
            .unwrap();
        assert_eq!(outcome, CreateOutcome::Created);
        server.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_statefulset_pod_takes_back_its_kept_ip_in_one_write_and_others_cannot() {
        let mut kept = claims::builder("10.0.0.9", "web", "web-0")
            .request("req-old")
            .at(unix_now())
            .build();
        kept.phase = Phase::Released;
        kept.pod.uid = Some("pod-uid-old".into());
        let mut kept_value = stored(&kept, 8);
        kept_value["spec"]["sticky"] = json!(true);
        let (client, server) = scripted(vec![
            // web-0 again: replaces exactly the kept record in one write (no moment in which
            // another create could find the IP free, as between a delete and a create)
            step("POST", CLAIMS, 409, already_exists("10.0.0.9")),
            step("GET", format!("{CLAIMS}/10.0.0.9"), 200, kept_value.clone()),
            step(
                "PUT",
                format!("{CLAIMS}/10.0.0.9"),
                200,
                stored(
                    &claims::builder("10.0.0.9", "web", "web-0")
                        .request("req-new")
                        .at(unix_now())
                        .build(),
                    9,
                ),
            ),
            // web-1 may not take it.
            step("POST", CLAIMS, 409, already_exists("10.0.0.9")),
            step("GET", format!("{CLAIMS}/10.0.0.9"), 200, kept_value),
        ]);
        let ledger = KubeLedger::new(client);
        assert_eq!(
            ledger
                .create(
                    claims::builder("10.0.0.9", "web", "web-0")
                        .request("req-new")
                        .at(unix_now())
                        .build()
                        .into()
                )
                .await
                .unwrap(),
            CreateOutcome::Created
        );
        assert!(matches!(
            ledger
                .create(
                    claims::builder("10.0.0.9", "web", "web-1")
                        .request("req-1")
                        .at(unix_now())
                        .build()
                        .into()
                )
                .await
                .unwrap(),
            CreateOutcome::AlreadyHeld(_)
        ));
        let seen = server.await.unwrap();
        let put = &seen[2].body;
        assert_eq!(
            put["metadata"]["resourceVersion"], "8",
            "the write is conditional on the exact record: {put}"
        );
        assert_eq!(put["spec"]["requestUid"], "req-new", "{put}");
        assert_eq!(put["spec"]["podUid"], Value::Null, "{put}");
        assert_eq!(
            put["metadata"]["finalizers"],
            json!(["ip-webhook.io/pod-gone"]),
            "the claim keeps its finalizer: {put}"
        );
    }

    /// A status written for the grant an IPClaim held before it was taken over is not the new
    /// grant's: the claim reads as Reserved until its own status is written.
    #[test]
    fn a_status_of_the_grant_taken_over_reads_as_reserved() {
        let mut taken = stored(
            &claims::builder("10.0.0.9", "web", "web-0")
                .request("req-new")
                .at(unix_now())
                .build(),
            9,
        );
        taken["status"] = json!({
            "phase": "Released", "requestUid": "req-old", "releaseAt": "2026-01-01T00:00:00Z",
        });
        let resource: IPClaim = serde_json::from_value(taken.clone()).unwrap();
        let read = ip_webhook_ledger::kubernetes::from_resource(&resource).unwrap();
        assert_eq!(read.phase, Phase::Reserved);
        assert_eq!(read.release_at, None);
        taken["status"]["requestUid"] = json!("req-new");
        let resource: IPClaim = serde_json::from_value(taken).unwrap();
        let read = ip_webhook_ledger::kubernetes::from_resource(&resource).unwrap();
        assert_eq!(read.phase, Phase::Released, "its own status counts");
    }

    #[tokio::test(start_paused = true)]
    async fn release_deletes_only_the_same_requests_record() {
        let mine = claims::builder("10.0.0.4", "web", "web-a")
            .request("req-a")
            .at(unix_now())
            .build();
        let newer = claims::builder("10.0.0.4", "web", "web-b")
            .request("req-b")
            .at(unix_now())
            .build();
        let (client, server) = scripted(vec![
            step("GET", format!("{CLAIMS}/10.0.0.4"), 200, stored(&mine, 3)),
            // the finalizer comes off first
            step("PATCH", format!("{CLAIMS}/10.0.0.4"), 200, stored(&mine, 3)),
            step(
                "DELETE",
                format!("{CLAIMS}/10.0.0.4"),
                200,
                stored(&mine, 3),
            ),
            // The IP now belongs to another admission: releasing the old claim again is a no-op.
            step("GET", format!("{CLAIMS}/10.0.0.4"), 200, stored(&newer, 5)),
            // Someone deleted it meanwhile: the precondition fails with 409 Conflict (on taking the
            // finalizer off, the first write).
            step("GET", format!("{CLAIMS}/10.0.0.4"), 200, stored(&newer, 5)),
            step(
                "PATCH",
                format!("{CLAIMS}/10.0.0.4"),
                409,
                status(
                    409,
                    "Conflict",
                    "Precondition failed: UID in precondition: uid-10.0.0.4-5, UID in object meta: other",
                ),
            ),
        ]);
        let ledger = KubeLedger::new(client);
        assert!(ledger.release(&mine).await.unwrap());
        assert!(!ledger.release(&mine).await.unwrap());
        assert!(!ledger.release(&newer).await.unwrap());
        server.await.unwrap();
    }

    fn claiming_pod(name: &str, uid: &str, ip: &str) -> ClaimingPod {
        ClaimingPod {
            namespace: "default".into(),
            name: name.into(),
            uid: uid.into(),
            ips: vec![ip.parse().unwrap()],
            created_at: unix_now(),
            terminating: false,
            stateful: false,
            app: "web".into(),
            token: None,
            vm: None,
        }
    }

    fn executor(client: &Client) -> Executor {
        Executor {
            claims: Api::all(client.clone()),
            pools: Api::all(client.clone()),
            pods: Api::all(client.clone()),
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "ip-webhook".into(),
                    instance: Some("test".into()),
                },
            ),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            reported_duplicates: Default::default(),
            vms: crate::cluster::virtual_machines::VmDirectory::new(client.clone(), false).into(),
        }
    }

    fn resource(value: Value) -> Arc<IPClaim> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn bind_patches_the_pod_uid_then_the_phase() {
        let mut reserved = claims::builder("10.0.0.5", "web", "")
            .request("req-5")
            .at(unix_now())
            .build();
        reserved.pod.generate_name = "web-7d9f-".into();
        let mut bound = stored(&reserved, 11);
        bound["spec"]["podUid"] = json!("pod-uid-5");
        let (client, server) = scripted(vec![
            step("PATCH", format!("{CLAIMS}/10.0.0.5"), 200, bound.clone()),
            step("PATCH", format!("{CLAIMS}/10.0.0.5/status"), 200, bound),
        ]);
        let plan = Plan {
            actions: vec![Action::Bind {
                claim: resource(stored(&reserved, 10)),
                pod: claiming_pod("web-7d9f-x2x", "pod-uid-5", "10.0.0.5"),
            }],
            next_due: None,
            duplicates: Vec::new(),
        };
        assert_eq!(executor(&client).run(&plan).await, 1);
        let seen = server.await.unwrap();
        assert_eq!(seen[0].body["spec"]["podUid"], "pod-uid-5");
        assert_eq!(seen[0].body["spec"]["podName"], "web-7d9f-x2x");
        assert_eq!(seen[0].body["metadata"]["resourceVersion"], "10");
        assert_eq!(seen[1].body["status"]["phase"], "Bound");
        assert_eq!(seen[1].body["metadata"]["resourceVersion"], "11");
    }

    fn pod_meta(name: &str, uid: &str) -> Value {
        json!({
            "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "40"},
        })
    }

    #[tokio::test(start_paused = true)]
    async fn release_is_by_uid_a_recreated_pod_of_the_same_name_does_not_keep_the_old_claim() {
        let mut old = claims::builder("10.0.0.6", "web", "api-1")
            .request("req-6")
            .at(unix_now())
            .build();
        old.phase = Phase::Bound;
        old.pod.uid = Some("uid-old".into());
        let value = stored(&old, 20);
        let (client, server) = scripted(vec![
            // The reconciler double-checks: api-1 exists, but it is a new pod (other UID).
            step(
                "GET",
                "/api/v1/namespaces/default/pods/api-1",
                200,
                pod_meta("api-1", "uid-new"),
            ),
            // the finalizer comes off first
            step("PATCH", format!("{CLAIMS}/10.0.0.6"), 200, value.clone()),
            step("DELETE", format!("{CLAIMS}/10.0.0.6"), 200, value.clone()),
            step(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/default/events",
                201,
                json!({}),
            ),
            // Second pass with a stale cache: the API says the pod with that UID lives: keep.
            step(
                "GET",
                "/api/v1/namespaces/default/pods/api-1",
                200,
                pod_meta("api-1", "uid-old"),
            ),
        ]);
        let plan = Plan {
            actions: vec![Action::Drop {
                claim: resource(value),
                reason: DropReason::PodGone,
            }],
            next_due: None,
            duplicates: Vec::new(),
        };
        let executor = executor(&client);
        assert_eq!(executor.run(&plan).await, 1);
        assert_eq!(executor.run(&plan).await, 0, "a live UID is never released");
        assert_eq!(
            executor.metrics.leaks_reclaimed.get(),
            1,
            "one leak reclaimed, counted once"
        );
        assert_eq!(executor.metrics.reservations_expired.get(), 0);
        let seen = server.await.unwrap();
        assert_eq!(
            seen[1].body["metadata"],
            json!({"finalizers": null, "resourceVersion": "20"}),
            "the finalizer comes off the exact record"
        );
        assert_eq!(seen[2].body["preconditions"]["uid"], "uid-10.0.0.6-20");
        assert_eq!(seen[3].body["reason"], "IPReclaimed");
        assert_eq!(seen[3].body["regarding"]["kind"], "IPClaim");
        assert!(
            seen[3].body["note"]
                .as_str()
                .unwrap()
                .contains("default/api-1 (uid uid-old)"),
            "{}",
            seen[2].body["note"]
        );
    }

    /// Let `claims` be seen by the leader now, then let `age` pass on its clock.
    async fn seen_for(reconciler: &Reconciler, claims: &[Arc<IPClaim>], age: Duration) {
        let now = reconciler.started.elapsed().as_secs();
        reconciler
            .view
            .lock()
            .unwrap()
            .rebuild(claims, &Default::default(), now, true);
        tokio::time::advance(age).await;
    }

    fn options() -> ClusterOptions {
        ClusterOptions {
            rules: Rules {
                reservation_ttl: 120,
                sticky_grace: 300,
            },
            resync_period: Duration::from_secs(300),
            lease: LeaseSettings {
                name: "ip-webhook-reconciler".into(),
                namespace: "ip-webhook".into(),
                identity: "me".into(),
                duration: Duration::from_secs(15),
                renew_every: Duration::from_secs(5),
            },
            app_label: "app".into(),
            cni: ip_webhook_admission::annotations::Cni::Calico,
            calico_reservation: true,
            node_lost_grace: Duration::from_secs(300),
            kube_ovn_reservation: false,
            pod_ips: crate::cluster::PodIpSource::Pods,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_resync_frees_an_ip_whose_pod_delete_the_watch_missed() {
        let mut held = claims::builder("10.0.0.8", "web", "db-0")
            .request("req-8")
            .at(unix_now())
            .build();
        held.phase = Phase::Bound;
        held.pod.uid = Some("uid-db".into());
        let value = stored(&held, 30);
        let (client, server) = scripted(vec![
            step(
                "GET",
                CLAIMS,
                200,
                list("IPClaimList", 31, vec![value.clone()]),
            ),
            Step {
                query: vec![],
                ..step(
                    "GET",
                    "/api/v1/pods",
                    200,
                    list("PartialObjectMetadataList", 31, vec![]),
                )
            },
            step(
                "GET",
                "/api/v1/namespaces/default/pods/db-0",
                404,
                status(404, "NotFound", "pods \"db-0\" not found"),
            ),
            // the finalizer comes off first
            step("PATCH", format!("{CLAIMS}/10.0.0.8"), 200, value.clone()),
            step("DELETE", format!("{CLAIMS}/10.0.0.8"), 200, value.clone()),
            step(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/default/events",
                201,
                json!({}),
            ),
        ]);
        let allocator = Arc::new(
            Allocator::new(Arc::new(ip_webhook_ledger::MemoryLedger::new()))
                .await
                .unwrap(),
        );
        let caches = Arc::new(Caches::default());
        // The watch missed the delete: the cache still has the pod.
        Arc::make_mut(&mut caches.pods.lock().unwrap())
            .insert("uid-db".into(), claiming_pod("db-0", "uid-db", "10.0.0.8"));
        caches
            .claims
            .lock()
            .unwrap()
            .insert("10.0.0.8".into(), resource(value));
        let reconciler = Reconciler {
            client: client.clone(),
            caches: caches.clone(),
            allocator: allocator.clone(),
            executor: executor(&client),
            options: options(),
            lists: None,
            view: Default::default(),
            started: tokio::time::Instant::now(),
            listed_seen: Default::default(),
        };
        // The leader has seen the claim bound for longer than the admission window.
        seen_for(&reconciler, &caches.claim_list(), Duration::from_secs(121)).await;
        reconciler.pass(true, true).await;
        let seen = server.await.unwrap();
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[5].body["reason"], "IPReclaimed");
        assert_eq!(
            allocator
                .holder(&"10.0.0.8".parse().unwrap())
                .map(|c| c.pod.name),
            Some("db-0".into()),
            "the index was rebuilt from the fresh list (the watch then drops the record)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_watch_relists_and_drops_what_was_deleted_meanwhile() {
        let gone = claims::builder("10.0.0.10", "web", "old")
            .request("req-10")
            .at(unix_now())
            .build();
        let stays = claims::builder("10.0.0.11", "web", "new")
            .request("req-11")
            .at(unix_now())
            .build();
        let expired = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version: 50 (60)")});
        let watch_steps = vec![
            step(
                "GET",
                CLAIMS,
                200,
                list("IPClaimList", 50, vec![stored(&gone, 49)]),
            ),
            Step {
                query: vec!["watch=true", "resourceVersion=50"],
                ..step("GET", CLAIMS, 200, expired)
            },
            step(
                "GET",
                CLAIMS,
                200,
                list("IPClaimList", 61, vec![stored(&stays, 60)]),
            ),
        ];
        let (client, server) = scripted(watch_steps);
        let allocator = Arc::new(
            Allocator::new(Arc::new(ip_webhook_ledger::MemoryLedger::new()))
                .await
                .unwrap(),
        );
        let caches = Arc::new(Caches::default());
        let task = tokio::spawn(crate::cluster::watch_claims(
            Api::all(client),
            caches.clone(),
            allocator.clone(),
        ));
        server.await.unwrap();
        // Let the watcher apply the relist (paused time advances through its backoff).
        for _ in 0..50 {
            if allocator.holder(&stays.ip).is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            allocator.holder(&gone.ip).is_none(),
            "the delete missed during the outage is applied"
        );
        assert_eq!(
            allocator.holder(&stays.ip).map(|c| c.pod.name),
            Some("new".into())
        );
        assert!(caches.claims.lock().unwrap().contains_key("10.0.0.11"));
        assert!(!caches.claims.lock().unwrap().contains_key("10.0.0.10"));
        task.abort();
    }

    const LEASE: &str =
        "/apis/coordination.k8s.io/v1/namespaces/ip-webhook/leases/ip-webhook-reconciler";
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ip-webhook/leases";

    fn lease(holder: &str, rv: u32, renew: &str) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "ip-webhook-reconciler", "namespace": "ip-webhook", "resourceVersion": rv.to_string(), "uid": "lease-uid"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew, "leaseTransitions": 0},
        })
    }

    #[tokio::test(start_paused = true)]
    async fn leader_acquires_renews_and_loses_the_lease() {
        let (client, server) = scripted(vec![
            step(
                "GET",
                LEASE,
                404,
                status(
                    404,
                    "NotFound",
                    "leases.coordination.k8s.io \"ip-webhook-reconciler\" not found",
                ),
            ),
            step(
                "POST",
                LEASES,
                201,
                lease("me", 1, "2026-01-01T00:00:00.000000Z"),
            ),
            step(
                "GET",
                LEASE,
                200,
                lease("me", 1, "2026-01-01T00:00:00.000000Z"),
            ),
            step(
                "PUT",
                LEASE,
                200,
                lease("me", 2, "2026-01-01T00:00:05.000000Z"),
            ),
            // Someone else wrote the lease in between: our renewal conflicts.
            step(
                "GET",
                LEASE,
                200,
                lease("me", 2, "2026-01-01T00:00:05.000000Z"),
            ),
            step(
                "PUT",
                LEASE,
                409,
                status(
                    409,
                    "Conflict",
                    "Operation cannot be fulfilled on leases.coordination.k8s.io \"ip-webhook-reconciler\": the object has been modified; please apply your changes to the latest version and try again",
                ),
            ),
        ]);
        let mut elector = Elector::new(Api::namespaced(client, "ip-webhook"), options().lease);
        assert!(elector.step().await, "created the lease");
        assert!(elector.step().await, "renewed");
        assert!(!elector.step().await, "lost it on a conflicting write");
        let seen = server.await.unwrap();
        assert_eq!(seen[1].body["spec"]["holderIdentity"], "me");
        assert_eq!(
            seen[3].body["metadata"]["resourceVersion"], "1",
            "renewal is conditional"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_takes_over_only_after_the_lease_went_unrenewed() {
        let other = lease("other", 7, "2026-01-01T00:00:00.000000Z");
        let (client, server) = scripted(vec![
            step("GET", LEASE, 200, other.clone()),
            step("GET", LEASE, 200, other.clone()),
            step("GET", LEASE, 200, other),
            step(
                "PUT",
                LEASE,
                200,
                lease("me", 8, "2026-01-01T00:00:20.000000Z"),
            ),
        ]);
        let mut elector = Elector::new(Api::namespaced(client, "ip-webhook"), options().lease);
        assert!(!elector.step().await);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(
            !elector.step().await,
            "10s unchanged is within the 15s lease"
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(elector.step().await, "16s unchanged: expired, taken over");
        let seen = server.await.unwrap();
        assert_eq!(seen[3].body["spec"]["holderIdentity"], "me");
        assert_eq!(seen[3].body["spec"]["leaseTransitions"], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_steps_down_before_the_lease_runs_out() {
        let unavailable = || {
            step(
                "GET",
                LEASE,
                503,
                status(
                    503,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                ),
            )
        };
        let (client, server) = scripted(vec![
            step(
                "GET",
                LEASE,
                200,
                lease("me", 3, "2026-01-01T00:00:00.000000Z"),
            ),
            step(
                "PUT",
                LEASE,
                200,
                lease("me", 4, "2026-01-01T00:00:00.000000Z"),
            ),
            unavailable(),
            unavailable(),
        ]);
        let mut elector = Elector::new(Api::namespaced(client, "ip-webhook"), options().lease);
        assert!(elector.step().await);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            elector.step().await,
            "one failed renewal 5s after the last: still leading"
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!elector.step().await, "16s without renewal: stepped down");
        server.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_expires_old_reservations_and_keeps_a_gone_statefulset_pods_ip() {
        let now = unix_now();
        // Admitted 121s ago (TTL 120s), no pod ever appeared.
        let mut stale = claims::builder("10.0.0.20", "web", "")
            .request("req-20")
            .at(unix_now())
            .build();
        stale.pod.generate_name = "job-".into();
        stale.created_at = now - 121;
        // Admitted 60s ago: still within the TTL.
        let mut young = claims::builder("10.0.0.21", "web", "")
            .request("req-21")
            .at(unix_now())
            .build();
        young.pod.generate_name = "job-".into();
        young.created_at = now - 60;
        // web-0 (StatefulSet) is gone.
        let mut sticky = claims::builder("10.0.0.22", "web", "web-0")
            .request("req-22")
            .at(unix_now())
            .build();
        sticky.phase = Phase::Bound;
        sticky.pod.uid = Some("uid-web-0".into());
        let mut sticky_value = stored(&sticky, 70);
        sticky_value["spec"]["sticky"] = json!(true);
        // Released 301s ago: the 300s grace is over.
        let mut done = claims::builder("10.0.0.23", "web", "web-1")
            .request("req-23")
            .at(unix_now())
            .build();
        done.phase = Phase::Released;
        done.updated_at = now - 301;
        let mut done_value = stored(&done, 71);
        done_value["spec"]["sticky"] = json!(true);

        let (client, server) = scripted(vec![
            // the finalizer comes off first
            step(
                "PATCH",
                format!("{CLAIMS}/10.0.0.20"),
                200,
                stored(&stale, 60),
            ),
            step(
                "DELETE",
                format!("{CLAIMS}/10.0.0.20"),
                200,
                stored(&stale, 60),
            ),
            step(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/default/events",
                201,
                json!({}),
            ),
            step(
                "PATCH",
                format!("{CLAIMS}/10.0.0.22/status"),
                200,
                sticky_value.clone(),
            ),
            // the finalizer comes off first
            step(
                "PATCH",
                format!("{CLAIMS}/10.0.0.23"),
                200,
                done_value.clone(),
            ),
            step(
                "DELETE",
                format!("{CLAIMS}/10.0.0.23"),
                200,
                done_value.clone(),
            ),
        ]);
        let caches = Arc::new(Caches::default());
        for value in [
            stored(&stale, 60),
            stored(&young, 61),
            sticky_value,
            done_value,
        ] {
            let resource = resource(value);
            caches
                .claims
                .lock()
                .unwrap()
                .insert(resource.metadata.name.clone().unwrap(), resource);
        }
        let reconciler = Reconciler {
            client: client.clone(),
            caches,
            allocator: Arc::new(
                Allocator::new(Arc::new(ip_webhook_ledger::MemoryLedger::new()))
                    .await
                    .unwrap(),
            ),
            executor: executor(&client),
            options: options(),
            lists: None,
            view: Default::default(),
            started: tokio::time::Instant::now(),
            listed_seen: Default::default(),
        };
        // Ages on the leader's own clock: the young reservation was first seen 60 s ago, the others
        // long before; the times the claims carry play no part.
        let all = reconciler.caches.claim_list();
        let (young_claim, older): (Vec<_>, Vec<_>) =
            all.into_iter().partition(|c| c.spec.ip == "10.0.0.21");
        seen_for(&reconciler, &older, Duration::from_secs(240)).await;
        let all: Vec<_> = older.into_iter().chain(young_claim).collect();
        seen_for(&reconciler, &all, Duration::from_secs(60)).await;
        let next = reconciler.pass(false, true).await;
        let seen = server.await.unwrap();
        assert_eq!(seen[2].body["reason"], "ReservationExpired");
        assert_eq!(seen[3].body["status"]["phase"], "Released");
        // The young reservation is due at its expiry (60s from now), not before.
        let due = next.expect("a wake-up for the young reservation") - tokio::time::Instant::now();
        assert!(
            due > Duration::from_secs(58) && due <= Duration::from_secs(61),
            "{due:?}"
        );
    }
}
