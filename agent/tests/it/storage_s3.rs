//! The object tier against a real S3-compatible server on loopback.
//!
//! Runs when `DEN_TEST_S3_ENDPOINT` is set (e.g. `http://127.0.0.1:9000`, as `tests/run`
//! sets it after starting `moto_server -H 127.0.0.1 -p 9000`); otherwise prints
//! "skipped". The bucket is `DEN_TEST_S3_BUCKET` (default `den-test`); the test creates it
//! with an unsigned `PUT /bucket`, which moto accepts (for a server that checks
//! signatures, create the bucket beforehand). Credentials come from `AWS_ACCESS_KEY_ID` /
//! `AWS_SECRET_ACCESS_KEY` when set, else `testing`/`testing`. Every run uses a fresh
//! prefix, so runs never see each other's objects.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};

use den_agent::engine::SyntheticKv;
use den_agent::tiers::{
    Chunk, ChunkMeta, ChunkStore, ObjectConfig, ObjectTier, S3Settings, Secret, TierError,
};
use den_protocol::candidate::Tier;
use den_protocol::chunk::plan_chunks;
use den_protocol::ids::ModelFingerprint;

fn endpoint() -> Option<String> {
    let ep = std::env::var("DEN_TEST_S3_ENDPOINT")
        .ok()?
        .trim()
        .to_owned();
    if ep.is_empty() {
        return None;
    }
    Some(if ep.contains("://") {
        ep
    } else {
        format!("http://{ep}")
    })
}

fn settings(endpoint: &str) -> S3Settings {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    S3Settings {
        endpoint: Some(endpoint.to_owned()),
        region: Some(env("AWS_REGION").unwrap_or_else(|| "us-east-1".into())),
        access_key_id: Some(env("AWS_ACCESS_KEY_ID").unwrap_or_else(|| "testing".into())),
        secret_access_key: Some(Secret::new(
            env("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|| "testing".into()),
        )),
        session_token: None,
        allow_http: None,
    }
}

async fn create_bucket(endpoint: &str, bucket: &str) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    // 200 (created) or 409 (already exists) are both fine; anything else shows up as a
    // failed put below with the server's own message.
    let _ = client.put(format!("{endpoint}/{bucket}")).send().await;
}

fn chunks(model: &str, n: usize, row_bytes: u64) -> Vec<Chunk> {
    let model = ModelFingerprint::from(model);
    let tokens: Vec<u32> = (0..(n as u32 * 256)).map(|i| i * 7 + 3).collect();
    let kv = SyntheticKv::new(&model);
    plan_chunks(&tokens, 256)
        .iter()
        .map(|d| {
            let toks = &tokens[d.start as usize..d.end() as usize];
            let payload = kv.rows(d.start, toks, row_bytes as usize);
            Chunk::new(ChunkMeta::for_descriptor(&model, d, row_bytes), payload).unwrap()
        })
        .collect()
}

#[tokio::test]
async fn s3_object_tier_round_trip_corruption_and_missing() {
    let Some(endpoint) = endpoint() else {
        den_tests::environment::missing("DEN_TEST_S3_ENDPOINT is not set");
        return;
    };
    let bucket = std::env::var("DEN_TEST_S3_BUCKET").unwrap_or_else(|_| "den-test".into());
    create_bucket(&endpoint, &bucket).await;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let url = format!("s3://{bucket}/run-{}-{nanos}", std::process::id());
    let config = ObjectConfig {
        url: url.parse().unwrap(),
        s3: settings(&endpoint),
    };
    assert!(
        !format!("{config:?}").contains("testing"),
        "credentials leaked into Debug"
    );
    let tier = ObjectTier::open(&config).unwrap();

    let set = chunks("s3-model", 3, 1024);
    for c in &set {
        assert!(!tier.contains(c.key()).await.unwrap());
        let r = tier.put(c).await.unwrap();
        assert_eq!((r.tier, r.content_hash), (Tier::Object, c.content_hash()));
        // The receipt means the object is there: another client sees it immediately.
        assert!(tier.contains(c.key()).await.unwrap());
    }
    for c in &set {
        let got = tier.get(c.key()).await.unwrap();
        assert_eq!(&got, c);
        assert!(got.meta.start % 256 == 0);
    }
    let usage = tier.usage().await.unwrap();
    assert_eq!(usage.count, 3);

    // Flip one payload byte in the bucket: the read is Corrupt, never wrong KV.
    let victim = &set[1];
    let path = tier.location(victim.key());
    let mut raw = tier
        .store()
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let last = raw.len() - 1;
    raw[last] ^= 0x01;
    tier.store()
        .put(&path, PutPayload::from(Bytes::from(raw)))
        .await
        .unwrap();
    let e = tier.get(victim.key()).await.unwrap_err();
    assert!(
        matches!(
            e,
            TierError::Corrupt {
                field: "content sha256",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.means_recompute());

    // Missing and delete.
    assert!(tier.delete(set[0].key()).await.unwrap());
    let e = tier.get(set[0].key()).await.unwrap_err();
    assert!(
        matches!(
            e,
            TierError::Missing {
                tier: Tier::Object,
                ..
            }
        ),
        "{e}"
    );
    let totals = tier.io_totals();
    assert_eq!(
        (totals.writes.count, totals.corrupt, totals.misses),
        (3, 1, 1)
    );
    assert!(totals.reads.bytes_per_ms.value.is_some());
    for c in &set[1..] {
        tier.delete(c.key()).await.unwrap();
    }
}

#[tokio::test]
async fn s3_unreachable_endpoint_is_an_io_error_in_seconds() {
    // Port 9 on loopback (discard) is closed on test hosts: connection refused at once.
    let config = ObjectConfig {
        url: "s3://den-nowhere/x".parse().unwrap(),
        s3: settings("http://127.0.0.1:9"),
    };
    let tier = ObjectTier::open(&config).unwrap();
    let c = chunks("m", 1, 16).remove(0);
    let t0 = Instant::now();
    let e = tier.put(&c).await.unwrap_err();
    assert!(
        matches!(
            e,
            TierError::Io {
                tier: Tier::Object,
                op: "put",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(40),
        "took {:?}",
        t0.elapsed()
    );
    assert!(!e.to_string().contains("testing"));
    assert!(!e.means_recompute());
}
