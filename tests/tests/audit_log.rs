//! The verifiable audit (issue "A verifiable audit"): every audit event and
//! operator action sealed into an RFC 6962 log whose checkpoints the planner
//! signs. Against the real PostgreSQL, RabbitMQ and Redis: a replay's log
//! verifies offline; each way of tampering with the rows in SQL (an action
//! changed, an operator action deleted, a forged `sent` inserted, the newest
//! events cut off, a checkpoint re-signed with another key) is named by
//! verification; inclusion and consistency proofs verify; and planners
//! killed with SIGKILL while they seal leave one log with no gap, no fork and
//! nothing sealed twice.

mod support;

use std::{path::PathBuf, str::FromStr, time::Duration};

use redrive_planner::config::AuditLogSettings;
use redrive_proto::v1::{
    self, ExportAuditLogRequest, ExportFormat, GetAuditCheckpointRequest,
    ProveAuditConsistencyRequest, ProveAuditInclusionRequest, planner_client::PlannerClient,
};
use redrive_tests::{ExecutorHandle, TestBed, init_logging, scenario, unique, wait_until};
use redrive_tlog::{
    Hash,
    checkpoint::{Checkpoint, open_checkpoint},
    export::read_log_export,
    leaf::Entry,
    merkle,
    note::{Signer, Verifier},
    verify::{Report, verify},
};
use tonic::{Code, transport::Channel};

use support::{
    approved_plan, assert_bed_audit, captured, capturing, consume, incident, reject_next,
    stop_consuming, wait_completed,
};

/// A signing key in a file, its verifier, and a witness directory.
struct Keys {
    dir: tempfile::TempDir,
    key_file: PathBuf,
    key_text: String,
    verifier: Verifier,
}

impl Keys {
    fn new(name: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let signer = Signer::generate(name)?;
        let key_file = dir.path().join("audit.key");
        std::fs::write(&key_file, format!("{}\n", signer.key_text()))?;
        Ok(Self {
            key_text: signer.key_text(),
            verifier: signer.verifier(),
            key_file,
            dir,
        })
    }

    fn witness(&self) -> PathBuf {
        self.dir.path().join("witness")
    }

    /// The planner's audit log flags: this key, a checkpoint every 5
    /// leaves or second, the witness directory.
    fn settings(&self) -> AuditLogSettings {
        AuditLogSettings {
            signing_key: Some(self.key_file.clone()),
            checkpoint_every: 5,
            checkpoint_interval: Duration::from_secs(1),
            witness_dir: Some(self.witness()),
            ..Default::default()
        }
    }
}

/// The whole log as `ExportAuditLog` streams it, and its checkpoint.
async fn export_log(
    client: &mut PlannerClient<Channel>,
    format: ExportFormat,
    tree_size: u64,
) -> anyhow::Result<(Vec<u8>, String)> {
    let mut stream = client
        .export_audit_log(ExportAuditLogRequest {
            format: format.into(),
            tree_size,
        })
        .await?
        .into_inner();
    let mut data = Vec::new();
    let mut checkpoint = String::new();
    while let Some(chunk) = stream.message().await? {
        if !chunk.checkpoint.is_empty() {
            checkpoint = chunk.checkpoint;
        }
        data.extend_from_slice(&chunk.data);
    }
    Ok((data, checkpoint))
}

/// The latest export (JSON Lines) verified with `keys`' verifier against
/// `witnessed` checkpoints kept outside.
async fn verified(
    client: &mut PlannerClient<Channel>,
    keys: &Keys,
    witnessed: &[String],
) -> anyhow::Result<Report> {
    let (data, note) = export_log(client, ExportFormat::Jsonl, 0).await?;
    let export = read_log_export(&data)?;
    assert_eq!(export.checkpoint.as_deref(), Some(note.as_str()));
    Ok(verify(&export, &note, &keys.verifier, witnessed)?)
}

/// Waits until nothing is queued and a checkpoint covers every leaf.
async fn sealed(pool: &sqlx::PgPool) -> anyhow::Result<u64> {
    let mut size = 0;
    wait_until(
        "the log sealed and checkpointed",
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            async move {
                let (pending, tree, checkpoint): (i64, i64, Option<i64>) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM audit_log_pending), \
                        (SELECT tree_size FROM audit_log_state), \
                        (SELECT max(tree_size) FROM audit_checkpoints)",
                )
                .fetch_one(&pool)
                .await?;
                Ok(pending == 0 && tree > 0 && checkpoint == Some(tree))
            }
        },
    )
    .await?;
    size += u64::try_from(
        sqlx::query_scalar::<_, i64>("SELECT tree_size FROM audit_log_state")
            .fetch_one(pool)
            .await?,
    )?;
    Ok(size)
}

fn problems(report: &Report) -> Vec<String> {
    report.problems.iter().map(ToString::to_string).collect()
}

fn to_hash(bytes: &[u8]) -> Hash {
    bytes.try_into().expect("32 bytes")
}

fn redrivectl(args: &[&str], planner: &str) -> anyhow::Result<(i32, String)> {
    let binaries = scenario::Binaries::of_tests()?;
    let output = std::process::Command::new(&binaries.redrivectl)
        .args(args)
        .env("REDRIVE_PLANNER", planner)
        .env("REDRIVE_ACTOR", "auditor")
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.code().unwrap_or(-1), text))
}

/// `redrivectl audit prove --plan PLAN --dead-letter ID [--key KEY]`.
fn prove(
    planner: &str,
    plan: &str,
    dead_letter: i64,
    key: Option<&str>,
) -> anyhow::Result<(i32, String)> {
    let dead_letter = dead_letter.to_string();
    let mut args = vec![
        "audit",
        "prove",
        "--plan",
        plan,
        "--dead-letter",
        &dead_letter,
    ];
    args.extend(key.iter().flat_map(|key| ["--key", *key]));
    redrivectl(&args, planner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_with_the_audit_in_postgresql_is_named_by_verification() -> anyhow::Result<()> {
    init_logging();
    let keys = Keys::new("redrive.test/audit")?;
    let broker = redrive_tests::Broker::connect().await?;
    let incident = incident(&broker, 12).await?;
    let dlq = incident.dlq.clone();
    let settings = keys.settings();
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&dlq]);
        config.audit_log = settings;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 12).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 500.0, 10, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await;
    executor.stop().await?;
    done?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 12);
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    let plan_id: uuid::Uuid = plan.plan_id.parse()?;

    // Everything the replay wrote is sealed; the export verifies, in both
    // formats, every event and action a leaf.
    let pool = bed.pool().await?;
    let size = sealed(&pool).await?;
    let (events, actions): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM audit_events), (SELECT count(*) FROM operator_actions)",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(
        size,
        u64::try_from(events + actions)?,
        "every row is a leaf"
    );
    let report = verified(&mut bed.client, &keys, &[]).await?;
    assert!(report.is_valid(), "{:?}", problems(&report));
    assert_eq!(report.leaves_checked, size);
    let (csv, note) = export_log(&mut bed.client, ExportFormat::Csv, 0).await?;
    let csv_export = read_log_export(&csv)?;
    assert!(verify(&csv_export, &note, &keys.verifier, &[])?.is_valid());

    // The witness outside the database holds the latest checkpoint: kept
    // for later, as an auditor would.
    let witnessed = std::fs::read_to_string(keys.witness().join("checkpoint"))?;
    let witnessed_size = open_checkpoint(&witnessed, &keys.verifier)?.size;
    assert_eq!(witnessed_size, size);

    // The same through redrivectl: export, verify offline, prove.
    let out = tempfile::tempdir()?;
    let csv_path = out.path().join("log.csv");
    let vkey_path = out.path().join("audit.pub");
    std::fs::write(&vkey_path, keys.verifier.key_text())?;
    let planner = bed.planner.url();
    let csv_arg = csv_path.to_string_lossy().to_string();
    let vkey_arg = vkey_path.to_string_lossy().to_string();
    let (code, text) = redrivectl(
        &["audit", "export", "--format", "csv", "--out", &csv_arg],
        &planner,
    )?;
    assert_eq!(code, 0, "{text}");
    let (code, text) = redrivectl(
        &["audit", "verify", "--export", &csv_arg, "--key", &vkey_arg],
        "http://127.0.0.1:9",
    )?;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("VERIFIED"), "{text}");
    // An export is evidence: a second one to the same file is refused and
    // leaves it (and its checkpoint) as it was, and no partial file behind;
    // likewise when only the checkpoint's file is in the way.
    let exported = std::fs::read(&csv_path)?;
    let (code, text) = redrivectl(
        &["audit", "export", "--format", "csv", "--out", &csv_arg],
        &planner,
    )?;
    assert_eq!(code, 64, "{text}");
    assert!(
        text.contains("exists: an export goes to a new file"),
        "{text}"
    );
    assert_eq!(std::fs::read(&csv_path)?, exported);
    let in_the_way = out.path().join("again.csv");
    std::fs::write(out.path().join("again.csv.checkpoint"), "mine\n")?;
    let (code, text) = redrivectl(
        &[
            "audit",
            "export",
            "--format",
            "csv",
            "--out",
            &in_the_way.to_string_lossy(),
        ],
        &planner,
    )?;
    assert_eq!(code, 64, "{text}");
    assert!(text.contains("again.csv.checkpoint exists"), "{text}");
    assert!(!in_the_way.exists());
    let mut left: Vec<String> = std::fs::read_dir(out.path())?
        .map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    left.sort();
    assert_eq!(
        left,
        [
            "again.csv.checkpoint",
            "audit.pub",
            "log.csv",
            "log.csv.checkpoint"
        ]
    );
    let dead_letter: i64 = sqlx::query_scalar(
        "SELECT dead_letter_id FROM audit_events WHERE plan_id = $1 AND action = 'sent' LIMIT 1",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    let (code, text) = prove(&planner, &plan.plan_id, dead_letter, Some(&vkey_arg))?;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!(
            "dead letter {dead_letter}: sent by plan {}",
            plan.plan_id
        )),
        "{text}"
    );
    assert!(text.contains("approve by "), "the approval, proven: {text}");
    assert!(text.contains("its signature checked"), "{text}");

    // Inclusion over gRPC: each proof verifies against the signed root.
    let proven = bed
        .client
        .prove_audit_inclusion(ProveAuditInclusionRequest {
            plan_id: plan.plan_id.clone(),
            dead_letter_id: dead_letter.to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let checkpoint = open_checkpoint(&proven.checkpoint.unwrap_or_default().note, &keys.verifier)?;
    assert!(
        proven.proofs.len() >= 3,
        "create, approve and the sent event"
    );
    for proof in &proven.proofs {
        let entry = Entry::from_canonical(proof.leaf.as_bytes())?;
        let hashes: Vec<Hash> = proof.hashes.iter().map(|hash| to_hash(hash)).collect();
        merkle::verify_inclusion(
            &entry.leaf_hash(),
            proof.leaf_index,
            checkpoint.size,
            &hashes,
            &checkpoint.root,
        )?;
        // A proof of another leaf's index does not verify.
        assert!(
            merkle::verify_inclusion(
                &entry.leaf_hash(),
                (proof.leaf_index + 1) % checkpoint.size,
                checkpoint.size,
                &hashes,
                &checkpoint.root,
            )
            .is_err()
        );
    }
    // The same leaf asked for by its index: the same record, and a proof
    // that verifies.
    let sent = proven
        .proofs
        .last()
        .ok_or_else(|| anyhow::anyhow!("no proof"))?;
    let by_index = bed
        .client
        .prove_audit_inclusion(ProveAuditInclusionRequest {
            leaf_index: Some(sent.leaf_index),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(by_index.proofs.len(), 1, "one leaf by its index");
    let alone = &by_index.proofs[0];
    assert_eq!(alone.leaf_index, sent.leaf_index);
    assert_eq!(alone.leaf, sent.leaf, "the record as stored, by index");
    let checkpoint = open_checkpoint(
        &by_index.checkpoint.unwrap_or_default().note,
        &keys.verifier,
    )?;
    merkle::verify_inclusion(
        &Entry::from_canonical(alone.leaf.as_bytes())?.leaf_hash(),
        alone.leaf_index,
        checkpoint.size,
        &alone
            .hashes
            .iter()
            .map(|hash| to_hash(hash))
            .collect::<Vec<_>>(),
        &checkpoint.root,
    )?;
    // Consistency between the first checkpoint and the latest.
    let first: i64 = sqlx::query_scalar("SELECT min(tree_size) FROM audit_checkpoints")
        .fetch_one(&pool)
        .await?;
    let first = bed
        .client
        .get_audit_checkpoint(GetAuditCheckpointRequest {
            tree_size: u64::try_from(first)?,
        })
        .await?
        .into_inner();
    let old = open_checkpoint(&first.note, &keys.verifier)?;
    let consistency = bed
        .client
        .prove_audit_consistency(ProveAuditConsistencyRequest {
            old_size: old.size,
            new_size: 0,
        })
        .await?
        .into_inner();
    let new = open_checkpoint(&consistency.new.unwrap_or_default().note, &keys.verifier)?;
    let hashes: Vec<Hash> = consistency
        .hashes
        .iter()
        .map(|hash| to_hash(hash))
        .collect();
    merkle::verify_consistency(old.size, new.size, &old.root, &new.root, &hashes)?;
    // Bad requests are named.
    let missing = bed
        .client
        .get_audit_checkpoint(GetAuditCheckpointRequest { tree_size: 987_654 })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    let bad = bed
        .client
        .prove_audit_inclusion(ProveAuditInclusionRequest {
            plan_id: "not-a-plan".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("plan_id"), "{}", bad.message());
    // What a plan did to a dead letter it never touched is nothing, said
    // as such: never the plan's other leaves as if they answered.
    bed.broker()
        .publish(
            &incident.exchange,
            "order.paid",
            br#"{"order_id":"late"}"#,
            lapin::BasicProperties::default().with_message_id("late".into()),
        )
        .await?;
    let channel = bed.broker().connection.create_channel().await?;
    reject_next(&channel, &incident.work, "the late message").await?;
    captured(&mut bed.client, &incident.dlq, 13).await?;
    let untouched: i64 = sqlx::query_scalar(
        "SELECT id FROM dead_letters WHERE id NOT IN \
         (SELECT dead_letter_id FROM plan_items WHERE plan_id = $1)",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    for (dead_letter, expected) in [
        (
            untouched,
            format!(
                "dead letter {untouched} is not an item of plan {}",
                plan.plan_id
            ),
        ),
        (987_654_321_987, "no dead letter 987654321987".to_owned()),
    ] {
        let (code, text) = prove(&planner, &plan.plan_id, dead_letter, None)?;
        assert_eq!(code, 65, "{text}");
        assert!(text.contains(&expected), "{text}");
        assert!(!text.contains("leaf "), "no other leaf offered: {text}");
    }
    let nowhere = uuid::Uuid::now_v7().to_string();
    let (code, text) = redrivectl(&["audit", "prove", "--plan", &nowhere], &planner)?;
    assert_eq!(code, 65, "{text}");
    assert!(text.contains(&format!("no plan {nowhere}")), "{text}");
    // A planner without the key on this signed log (a replica left behind,
    // or one started to seal rows written with psql) is refused at start,
    // saying why; it seals nothing.
    let broker_id: String = sqlx::query_scalar("SELECT broker_id FROM deployment")
        .fetch_one(&pool)
        .await?;
    let binaries = scenario::Binaries::of_tests()?;
    let (mut keyless, log) = scenario::spawn_logged(
        &binaries.planner,
        [
            "--listen",
            &scenario::free_local_addr()?.to_string(),
            "--database-url",
            &bed.db.url(),
            "--broker-id",
            &broker_id,
        ],
    )?;
    let status = tokio::time::timeout(Duration::from_secs(30), keyless.wait()).await??;
    assert!(!status.success(), "{}", log.text());
    assert!(
        log.text()
            .contains("this planner has no --audit-signing-key"),
        "{}",
        log.text()
    );

    // 1. One event's action changed in SQL: named.
    let changed: i64 = sqlx::query_scalar(
        "UPDATE audit_events SET action = 'skipped_duplicate' \
         WHERE (plan_id, id) = (SELECT plan_id, id FROM audit_events \
                                WHERE plan_id = $1 AND action = 'sent' ORDER BY id DESC LIMIT 1) \
         RETURNING id",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    let report = verified(&mut bed.client, &keys, &[]).await?;
    let found = problems(&report);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains(&format!("event {changed} ")), "{found:?}");
    assert!(found[0].contains("changed"), "{found:?}");
    // The proof of that event no longer holds either.
    let (code, text) = prove(
        &planner,
        &plan.plan_id,
        dead_letter_of(&pool, changed).await?,
        Some(&vkey_arg),
    )?;
    assert_eq!(code, 65, "{text}");
    assert!(text.contains("NOT PROVEN"), "{text}");

    // 2. The approval deleted: named too.
    let approval: i64 = sqlx::query_scalar(
        "DELETE FROM operator_actions WHERE plan_id = $1 AND action = 'approve' RETURNING id",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    let report = verified(&mut bed.client, &keys, &[]).await?;
    let found = problems(&report);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found
            .iter()
            .any(|problem| problem.contains(&format!("action {approval} "))
                && problem.contains("gone from the database")),
        "{found:?}"
    );

    // 3. A forged `sent`, inserted by a session without the planner's key:
    // the sequencer refuses to seal it, and verification names it.
    let forged: i64 = sqlx::query_scalar(
        "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, \
             reason, wave, executor_id, attempt) \
         SELECT plan_id, slice_id, $2, message_key, destination, 'sent', '', wave, executor_id, 1 \
         FROM audit_events WHERE plan_id = $1 ORDER BY id LIMIT 1 RETURNING id",
    )
    .bind(plan_id)
    .bind(untouched)
    .fetch_one(&pool)
    .await?;
    refused(&pool, "event", forged, "the forged row refused").await?;
    let report = verified(&mut bed.client, &keys, &[]).await?;
    let found = problems(&report);
    assert_eq!(found.len(), 3, "{found:?}");
    let added = found
        .iter()
        .find(|problem| problem.contains(&format!("event {forged} ")))
        .unwrap_or_else(|| panic!("the forged event is named: {found:?}"));
    assert!(
        added.contains("never sealed") || added.contains("not in"),
        "{added}"
    );
    assert!(added.contains("MAC"), "why it was refused: {added}");
    // Asked to prove what the plan did to that dead letter: the forged row
    // is named as refused, never "wait for a newer checkpoint".
    let (code, text) = prove(&planner, &plan.plan_id, untouched, None)?;
    assert_eq!(code, 65, "{text}");
    assert!(
        text.contains("1 refused by the log, never to be sealed (no MAC"),
        "{text}"
    );
    // A forged event beside a dead letter's sealed ones: they are proven,
    // and the forged one is named as not proven, never covered by them.
    let first_sent: i64 = sqlx::query_scalar(
        "SELECT id FROM audit_events WHERE plan_id = $1 AND action = 'sent' ORDER BY id LIMIT 1",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    let touched = dead_letter_of(&pool, first_sent).await?;
    let beside: i64 = sqlx::query_scalar(
        "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, \
             reason, wave, executor_id, attempt) \
         SELECT plan_id, slice_id, dead_letter_id, message_key, destination, 'skipped_duplicate', '', \
                wave, executor_id, 2 \
         FROM audit_events WHERE id = $1 RETURNING id",
    )
    .bind(first_sent)
    .fetch_one(&pool)
    .await?;
    refused(
        &pool,
        "event",
        beside,
        "the forged row beside sealed ones refused",
    )
    .await?;
    let (code, text) = prove(&planner, &plan.plan_id, touched, None)?;
    assert_eq!(code, 65, "{text}");
    let sealed_line = text
        .lines()
        .find(|line| line.contains(&format!("(event {first_sent})")))
        .unwrap_or_else(|| panic!("the sealed event is listed: {text}"));
    assert!(
        sealed_line.starts_with("leaf ") && !sealed_line.contains("NOT PROVEN"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "NOT PROVEN: 1 event(s) of dead letter {touched} refused by the log, never to be sealed (no MAC"
        )),
        "{text}"
    );
    assert!(!text.contains(&format!("(event {beside}")), "{text}");
    // A forged operator action (psql, no MAC): `audit prove --plan` names
    // it as not proven, never covered by the plan's sealed actions.
    let forged_action: i64 = sqlx::query_scalar(
        "INSERT INTO operator_actions (plan_id, action, actor, reason) \
         VALUES ($1, 'approve', 'mallory', 'forged') RETURNING id",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    refused(&pool, "action", forged_action, "the forged action refused").await?;
    let (code, text) = redrivectl(&["audit", "prove", "--plan", &plan.plan_id], &planner)?;
    assert_eq!(code, 65, "{text}");
    assert!(
        text.contains(&format!(
            "NOT PROVEN: 1 operator action(s) of plan {} refused by the log, never to be sealed (no MAC",
            plan.plan_id
        )),
        "{text}"
    );
    assert!(!text.contains("mallory"), "{text}");

    // 4. A checkpoint re-signed with another key is refused, naming who
    // signed it.
    let (data, note) = export_log(&mut bed.client, ExportFormat::Jsonl, 0).await?;
    let export = read_log_export(&data)?;
    let text = note
        .split_once("\n\n")
        .map(|(text, _)| format!("{text}\n"))
        .unwrap_or_default();
    let impostor = Signer::generate("impostor.example/audit")?;
    let resigned = impostor.sign(&text)?;
    let refused = verify(&export, &resigned, &keys.verifier, &[])
        .unwrap_err()
        .to_string();
    assert!(refused.contains("impostor.example/audit"), "{refused}");
    // A forged root signed by the impostor is refused the same way.
    let mut forged_head = Checkpoint::parse(&text)?;
    forged_head.root = [7; 32];
    let forged_note = redrive_tlog::checkpoint::sign_checkpoint(&impostor, &forged_head)?;
    assert!(verify(&export, &forged_note, &keys.verifier, &[]).is_err());

    // 5. The newest leaves cut off (rows, leaves and checkpoints, as a
    // database writer covering tracks would): caught against the witnessed
    // checkpoint kept outside.
    let cut: i64 =
        sqlx::query_scalar("SELECT max(tree_size) FROM audit_checkpoints WHERE tree_size < $1")
            .bind(i64::try_from(witnessed_size)?)
            .fetch_one(&pool)
            .await?;
    bed.planner.halt().await?;
    sqlx::query(
        "DELETE FROM audit_events e USING audit_log l \
         WHERE l.kind = 'event' AND l.ref_id = e.id AND l.plan_id = e.plan_id AND l.leaf_index >= $1",
    )
    .bind(cut)
    .execute(&pool)
    .await?;
    sqlx::query(
        "DELETE FROM operator_actions a USING audit_log l \
         WHERE l.kind = 'action' AND l.ref_id = a.id AND l.leaf_index >= $1",
    )
    .bind(cut)
    .execute(&pool)
    .await?;
    sqlx::query("DELETE FROM audit_log WHERE leaf_index >= $1")
        .bind(cut)
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM audit_checkpoints WHERE tree_size > $1")
        .bind(cut)
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM audit_log_refused")
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM audit_events WHERE id = ANY($1)")
        .bind(vec![forged, beside])
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM operator_actions WHERE id = $1")
        .bind(forged_action)
        .execute(&pool)
        .await?;
    sqlx::query("UPDATE audit_log_state SET tree_size = $1")
        .bind(cut)
        .execute(&pool)
        .await?;
    let settings = keys.settings();
    bed.restart_planner(|config| {
        capturing(config, &[&incident.dlq]);
        config.audit_log = settings;
        config.audit_log.mode = "off".into();
    })
    .await?;
    let (data, note) = export_log(&mut bed.client, ExportFormat::Jsonl, 0).await?;
    let export = read_log_export(&data)?;
    let alone = verify(&export, &note, &keys.verifier, &[])?;
    assert_eq!(alone.tree_size, u64::try_from(cut)?);
    let report = verify(
        &export,
        &note,
        &keys.verifier,
        std::slice::from_ref(&witnessed),
    )?;
    let found = problems(&report);
    assert!(
        found.iter().any(|problem| problem.contains("cut short")
            && problem.contains(&witnessed_size.to_string())),
        "{found:?}"
    );
    // And the consistency check from the witnessed checkpoint fails.
    let witness_file = out.path().join("witnessed.checkpoint");
    std::fs::write(&witness_file, &witnessed)?;
    let (code, text) = redrivectl(
        &[
            "audit",
            "consistency",
            "--from",
            &witness_file.to_string_lossy(),
            "--key",
            &vkey_arg,
        ],
        &bed.planner.url(),
    )?;
    assert_ne!(code, 0, "{text}");
    pool.close().await;
    bed.finish().await
}

/// Waits until the sealing round has refused the row of `kind` (`event`
/// or `action`) with id `ref_id` (`what`, for the failure).
async fn refused(pool: &sqlx::PgPool, kind: &str, ref_id: i64, what: &str) -> anyhow::Result<()> {
    wait_until(what, Duration::from_secs(20), || async move {
        Ok(sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log_refused WHERE kind = $1 AND ref_id = $2",
        )
        .bind(kind)
        .bind(ref_id)
        .fetch_one(pool)
        .await?
            == 1)
    })
    .await
}

/// The dead letter of event `event_id`.
async fn dead_letter_of(pool: &sqlx::PgPool, event_id: i64) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT dead_letter_id FROM audit_events WHERE id = $1")
            .bind(event_id)
            .fetch_one(pool)
            .await?,
    )
}

/// A plan of one ingested dead letter, created (its `create` action
/// written) and never approved.
async fn one_plan(client: &mut PlannerClient<Channel>, tag: &str) -> anyhow::Result<v1::Plan> {
    let source = unique(tag);
    support::ingest(
        client,
        vec![v1::IngestDeadLettersRequest {
            source: source.clone(),
            message_id: "m-1".into(),
            body: br#"{"order_id":"o-1"}"#.to_vec(),
            reason: "rejected".into(),
            original_destination: "orders".into(),
            ..Default::default()
        }],
    )
    .await?;
    let report = support::precheck_selected(
        client,
        v1::Selector {
            sources: vec![source],
            ..Default::default()
        },
    )
    .await?;
    Ok(client
        .create_plan(v1::CreatePlanRequest {
            precheck_id: report.precheck_id,
            rate: Some(v1::Rate {
                per_second: 1.0,
                burst: 1,
                rationale: "never run".into(),
            }),
            ..Default::default()
        })
        .await?
        .into_inner())
}

/// A pool on `db_url` whose connections write as a planner holding `keys`
/// does: each carries the audit MAC key (`redrive.audit_mac`).
async fn mac_writer(db_url: &str, keys: &Keys) -> anyhow::Result<sqlx::PgPool> {
    let options = sqlx::postgres::PgConnectOptions::from_str(db_url)?.options([(
        "redrive.audit_mac",
        hex::encode(redrive_planner::audit::log::mac_pads(&keys.key_text)),
    )]);
    Ok(sqlx::PgPool::connect_with(options).await?)
}

/// A planner process of the workspace's binary on `db` with `keys`.
fn planner_process(db_url: &str, keys: &Keys) -> anyhow::Result<tokio::process::Child> {
    let binaries = scenario::Binaries::of_tests()?;
    let addr = scenario::free_local_addr()?;
    Ok(tokio::process::Command::new(&binaries.planner)
        .args([
            "--listen",
            &addr.to_string(),
            "--database-url",
            db_url,
            "--broker-id",
            "redrive-tests",
            "--audit-signing-key",
            &keys.key_file.to_string_lossy(),
            "--audit-checkpoint-every",
            "7000",
            "--audit-checkpoint-interval",
            "1s",
        ])
        .env("REDRIVE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?)
}

async fn kill_9(child: &mut tokio::process::Child) -> anyhow::Result<()> {
    if let Some(pid) = child.id() {
        std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()?;
    }
    child.wait().await?;
    Ok(())
}

async fn log_state(pool: &sqlx::PgPool) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT (SELECT tree_size FROM audit_log_state), (SELECT count(*) FROM audit_log_pending)",
    )
    .fetch_one(pool)
    .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planners_killed_while_sealing_leave_one_log_without_gap_fork_or_double_seal()
-> anyhow::Result<()> {
    init_logging();
    let keys = Keys::new("redrive.test/crash")?;
    // The schema and one plan, through an in-process planner.
    let settings = keys.settings();
    let mut bed = TestBed::without_broker(|config| config.audit_log = settings).await?;
    let db_url = bed.db.url();
    let plan = one_plan(&mut bed.client, "crash").await?;
    bed.planner.halt().await?;
    // 60,000 operator actions written as a planner writes them (its
    // connections carry the MAC key): six rounds of sealing queued.
    let writer = mac_writer(&db_url, &keys).await?;
    sqlx::query(
        "INSERT INTO operator_actions (plan_id, action, actor, reason) \
         SELECT $1, 'note', 'crash-test', 'row ' || g FROM generate_series(1, 60000) g",
    )
    .bind(plan.plan_id.parse::<uuid::Uuid>()?)
    .execute(&writer)
    .await?;
    writer.close().await;
    let pool = bed.pool().await?;
    let (_, queued) = log_state(&pool).await?;
    assert!(queued >= 60_000, "{queued} queued");

    // Two planners seal the one log; one is killed with SIGKILL in the
    // middle of sealing, three times, and restarted.
    let mut steady = planner_process(&db_url, &keys)?;
    let mut kills = 0;
    let mut last = 0;
    while kills < 3 {
        let mut victim = planner_process(&db_url, &keys)?;
        wait_until("sealing under way", Duration::from_secs(60), || {
            let pool = pool.clone();
            async move {
                let (size, pending) = log_state(&pool).await?;
                Ok(size > last && pending > 0)
            }
        })
        .await?;
        kill_9(&mut victim).await?;
        kills += 1;
        (last, _) = log_state(&pool).await?;
        if last >= 55_000 {
            break;
        }
    }
    anyhow::ensure!(kills >= 1, "no planner was killed while sealing");
    eprintln!(
        "killed a planner {kills} times while sealing; {last} leaves sealed at the last kill"
    );
    let mut victim = planner_process(&db_url, &keys)?;
    let size = sealed(&pool).await?;
    kill_9(&mut victim).await?;
    kill_9(&mut steady).await?;

    // No gap, nothing sealed twice, every row sealed, none refused.
    let (leaves, distinct, min, max): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT (kind, ref_id, plan_id)), min(leaf_index), max(leaf_index) FROM audit_log",
    )
    .fetch_one(&pool)
    .await?;
    let rows: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM operator_actions) + (SELECT count(*) FROM audit_events)",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!((leaves, distinct, min, max), (rows, rows, 0, rows - 1));
    assert_eq!(size, u64::try_from(rows)?);
    let refused: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log_refused")
        .fetch_one(&pool)
        .await?;
    assert_eq!(refused, 0);
    // No fork: every checkpoint's root is the root of that many leaves as
    // they stand, and the state's root is the whole tree's.
    let hashes: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT leaf_hash FROM audit_log ORDER BY leaf_index")
            .fetch_all(&pool)
            .await?;
    let hashes: Vec<Hash> = hashes.iter().map(|hash| to_hash(hash)).collect();
    let checkpoints: Vec<(i64, Vec<u8>, String)> = sqlx::query_as(
        "SELECT tree_size, root_hash, note FROM audit_checkpoints ORDER BY tree_size",
    )
    .fetch_all(&pool)
    .await?;
    assert!(checkpoints.len() >= 2, "{} checkpoints", checkpoints.len());
    for (tree_size, root, note) in &checkpoints {
        let tree_size = usize::try_from(*tree_size)?;
        assert_eq!(
            merkle::root(&hashes[..tree_size]),
            to_hash(root),
            "checkpoint {tree_size}"
        );
        let signed = open_checkpoint(note, &keys.verifier)?;
        assert_eq!(signed.root, to_hash(root));
    }
    let state_root: Vec<u8> = sqlx::query_scalar("SELECT root_hash FROM audit_log_state")
        .fetch_one(&pool)
        .await?;
    assert_eq!(merkle::root(&hashes), to_hash(&state_root));
    // Every leaf is the row as written.
    let settings = keys.settings();
    bed.restart_planner(|config| {
        config.audit_log = settings;
        config.audit_log.witness_dir = None;
    })
    .await?;
    let report = verified(&mut bed.client, &keys, &[]).await?;
    assert!(report.is_valid(), "{:?}", problems(&report));
    assert_eq!(report.leaves_checked, size);
    pool.close().await;
    bed.finish().await
}

/// A planner without the key that runs while another planner of its
/// database starts with the key (a replica left behind when the
/// key was rolled out) stops within a round, saying why, instead of
/// writing rows the log would refuse to seal for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_without_the_key_stops_once_its_log_is_signed() -> anyhow::Result<()> {
    init_logging();
    let keys = Keys::new("redrive.test/keyless")?;
    // The schema and one plan, sealed without a key.
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let db_url = bed.db.url();
    one_plan(&mut bed.client, "keyless").await?;
    bed.planner.halt().await?;
    let pool = sqlx::PgPool::connect(&db_url).await?;
    let binaries = scenario::Binaries::of_tests()?;
    let (mut keyless, log) = scenario::spawn_logged(
        &binaries.planner,
        [
            "--listen",
            &scenario::free_local_addr()?.to_string(),
            "--database-url",
            &db_url,
            "--broker-id",
            "redrive-tests",
        ],
    )?;
    wait_until(
        "the keyless planner to serve",
        Duration::from_secs(30),
        || {
            let text = log.text();
            async move { Ok(text.contains("planner serving its API")) }
        },
    )
    .await?;
    let mut keyed = planner_process(&db_url, &keys)?;
    let status = tokio::time::timeout(Duration::from_secs(60), keyless.wait()).await;
    // The keyless planner stops as the keyed one takes the log, which
    // signs its first checkpoint at its first round.
    let signed = wait_until("a checkpoint signed", Duration::from_secs(30), || async {
        Ok(
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit_checkpoints")
                .fetch_one(&pool)
                .await?
                > 0,
        )
    })
    .await
    .is_ok();
    kill_9(&mut keyed).await?;
    let status = status.map_err(|_| {
        anyhow::anyhow!(
            "the keyless planner kept running on a signed log:\n{}",
            log.text()
        )
    })??;
    assert!(signed, "the keyed planner signed a checkpoint");
    assert!(!status.success(), "{}", log.text());
    let text = log.text();
    assert!(
        text.contains("this planner has no --audit-signing-key")
            && text.contains("the planner stops"),
        "{text}"
    );
    Ok(())
}

/// A planner given another key than the one that signed its log is refused
/// at start (it would refuse the rows written under that key as forged and
/// sign a fork of the signers); the next key with `--audit-previous-key` is
/// taken (a rotation) as its planner starts, and a planner still running on
/// the old key stops at its next round, before the new key has signed
/// anything, instead of refusing the new key's rows; the rows written under
/// the old key meanwhile are sealed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_with_another_key_is_refused_and_an_old_key_stops_after_a_rotation()
-> anyhow::Result<()> {
    init_logging();
    let old = Keys::new("redrive.test/old")?;
    let new = Keys::new("redrive.test/new")?;
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let db_url = bed.db.url();
    one_plan(&mut bed.client, "rotation").await?;
    bed.planner.halt().await?;
    let pool = sqlx::PgPool::connect(&db_url).await?;
    let checkpoints = || async {
        anyhow::Ok(
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit_checkpoints")
                .fetch_one(&pool)
                .await?,
        )
    };
    let binaries = scenario::Binaries::of_tests()?;
    let planner_with = |key: Option<&Keys>, previous: Option<&Keys>, interval: &str| {
        let addr = scenario::free_local_addr()?;
        let mut args = vec![
            "--listen".to_owned(),
            addr.to_string(),
            "--database-url".to_owned(),
            db_url.clone(),
            "--broker-id".to_owned(),
            "redrive-tests".to_owned(),
            "--audit-checkpoint-interval".to_owned(),
            interval.to_owned(),
        ];
        if let Some(key) = key {
            args.push("--audit-signing-key".to_owned());
            args.push(key.key_file.to_string_lossy().into_owned());
        }
        if let Some(previous) = previous {
            args.push("--audit-previous-key".to_owned());
            args.push(previous.key_file.to_string_lossy().into_owned());
        }
        let (child, log) = scenario::spawn_logged(&binaries.planner, args)?;
        anyhow::Ok((child, log, addr))
    };
    type Started = (
        tokio::process::Child,
        scenario::ChildLog,
        std::net::SocketAddr,
    );
    let (mut on_old, old_log, _) = planner_with(Some(&old), None, "1s")?;
    wait_until(
        "a checkpoint signed by the old key",
        Duration::from_secs(30),
        || async { Ok(checkpoints().await? > 0) },
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}:\n{}", old_log.text()))?;
    let before_rotation = checkpoints().await?;
    let refused_at_start = |planner: Started, why: &str| {
        let why = why.to_owned();
        async move {
            let (mut child, log, _) = planner;
            let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await??;
            anyhow::ensure!(!status.success(), "started: {}", log.text());
            anyhow::ensure!(
                log.text().contains(&why),
                "not refused with {why:?}: {}",
                log.text()
            );
            anyhow::Ok(())
        }
    };
    // Another key, no rotation: refused at start, naming the log's signer.
    refused_at_start(
        planner_with(Some(&new), None, "1s")?,
        "signed by a key this planner does not hold (its latest checkpoint is signed by redrive.test/old)",
    )
    .await?;
    // The rotation, while the old key's planner runs on: the new key with
    // the old one as previous, signing nothing for an hour, so that every
    // row written under the new key is sealed before a checkpoint of the
    // new key exists. The log takes the new key as that planner starts;
    // the old key's planner stops at its next round, and seals none of
    // the new key's rows (it would refuse them as forged).
    let (size_before, _) = log_state(&pool).await?;
    let (mut rotated, rotated_log, rotated_addr) = planner_with(Some(&new), Some(&old), "24h")?;
    let serving = |addr: std::net::SocketAddr| async move {
        let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await
        else {
            return Ok(false);
        };
        let answer = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: "redrive.v1.Planner".to_owned(),
            })
            .await;
        Ok(answer.is_ok_and(|answer| {
            answer.into_inner().status()
                == tonic_health::pb::health_check_response::ServingStatus::Serving
        }))
    };
    wait_until(
        "the new key's planner to serve",
        Duration::from_secs(30),
        || serving(rotated_addr),
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}:\n{}", rotated_log.text()))?;
    let key_of_log = || async {
        anyhow::Ok(
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT to_jsonb(s) ->> 'signing_key' FROM audit_log_state s",
            )
            .fetch_one(&pool)
            .await?
            .unwrap_or_default(),
        )
    };
    // Rows under the new key, and under the old one as the old key's
    // planner goes on writing them until it stops.
    for (keys, rows) in [(&new, 200), (&old, 100)] {
        let writer = mac_writer(&db_url, keys).await?;
        sqlx::query(
            "INSERT INTO audit_events (plan_id, dead_letter_id, message_key, message_id, destination, \
                                       action, wave, executor_id, attempt) \
             SELECT id, g, 'rotation-' || g, 'm-' || g, 'orders', 'sent', 'main', 'rotation-test', 1 \
             FROM plans, generate_series(1, $1) g",
        )
        .bind(rows)
        .execute(&writer)
        .await?;
        writer.close().await;
    }
    let status = tokio::time::timeout(Duration::from_secs(30), on_old.wait()).await;
    let status = status.map_err(|_| anyhow::anyhow!("the old key's planner kept running"))??;
    assert!(!status.success(), "the old key's planner stops");
    assert!(
        old_log
            .text()
            .contains("the audit log in this database takes the key redrive.test/new+"),
        "{}",
        old_log.text()
    );
    wait_until(
        "the new key's rows sealed",
        Duration::from_secs(30),
        || async { Ok(log_state(&pool).await?.1 == 0) },
    )
    .await?;
    let (size_after, _) = log_state(&pool).await?;
    let refused: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log_refused")
        .fetch_one(&pool)
        .await?;
    assert_eq!(refused, 0, "no row written under either key was refused");
    assert_eq!(
        size_after - size_before,
        300,
        "every row of either key sealed once"
    );
    assert_eq!(
        checkpoints().await?,
        before_rotation,
        "the new key signed nothing yet"
    );
    assert!(key_of_log().await?.starts_with("redrive.test/new+"));
    // Now the old key alone, and no key, are refused at start, naming the
    // log's key.
    refused_at_start(
        planner_with(Some(&old), None, "1s")?,
        "the audit log in this database takes the key redrive.test/new+",
    )
    .await?;
    refused_at_start(
        planner_with(None, None, "1s")?,
        "this planner has no --audit-signing-key",
    )
    .await?;
    // A second rotation before the new key signed anything: the log's
    // latest checkpoint is still the old key's, which the third key's
    // planner does not hold; the log's key (its previous) decides.
    let third = Keys::new("redrive.test/third")?;
    // It waits a minute from when the log took the new key (the planners
    // on the old key may still be writing rows only the new key's planners
    // can check); the test moves that moment back instead of waiting.
    sqlx::query("UPDATE audit_log_state SET signing_key_taken_at = clock_timestamp()")
        .execute(&pool)
        .await?;
    let (mut on_third, third_log, third_addr) = planner_with(Some(&third), Some(&new), "24h")?;
    wait_until(
        "the third key's planner to wait",
        Duration::from_secs(30),
        || {
            let text = third_log.text();
            async move {
                Ok(text.contains("waiting until the planners on the key before it have stopped"))
            }
        },
    )
    .await?;
    assert!(!serving(third_addr).await?, "{}", third_log.text());
    assert!(key_of_log().await?.starts_with("redrive.test/new+"));
    sqlx::query(
        "UPDATE audit_log_state SET signing_key_taken_at = signing_key_taken_at - interval '2 minutes'",
    )
    .execute(&pool)
    .await?;
    wait_until(
        "the third key's planner to serve",
        Duration::from_secs(30),
        || serving(third_addr),
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}:\n{}", third_log.text()))?;
    assert!(key_of_log().await?.starts_with("redrive.test/third+"));
    let status = tokio::time::timeout(Duration::from_secs(30), rotated.wait()).await;
    let status = status.map_err(|_| anyhow::anyhow!("the new key's planner kept running"))??;
    assert!(
        !status.success(),
        "the new key's planner stops: {}",
        rotated_log.text()
    );
    // A rollback to the new key (the key the log moved from) checks the
    // rows still on their way itself: it takes the log at once.
    let (mut back, back_log, back_addr) = planner_with(Some(&new), Some(&third), "24h")?;
    wait_until(
        "the rollback's planner to serve",
        Duration::from_secs(20),
        || serving(back_addr),
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}:\n{}", back_log.text()))?;
    assert!(key_of_log().await?.starts_with("redrive.test/new+"));
    let status = tokio::time::timeout(Duration::from_secs(30), on_third.wait()).await;
    let status = status.map_err(|_| anyhow::anyhow!("the third key's planner kept running"))??;
    assert!(!status.success(), "the third key's planner stops");
    kill_9(&mut back).await?;
    pool.close().await;
    Ok(())
}

/// A key added after a planner without one died with rows still queued (a
/// crash leaves its last rows unsealed) seals those rows as the log's
/// history, as the keyless planner would have, instead of refusing real
/// events as forged; a row written without a MAC once the key is taken is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_after_a_keyless_planner_died_seals_what_it_left_queued() -> anyhow::Result<()>
{
    init_logging();
    let keys = Keys::new("redrive.test/added")?;
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let db_url = bed.db.url();
    one_plan(&mut bed.client, "added").await?;
    bed.planner.halt().await?;
    let pool = sqlx::PgPool::connect(&db_url).await?;
    // What a planner without a key leaves when killed mid-replay: events
    // queued with no MAC (its connections carry none).
    let insert = |from: i64, to: i64| {
        sqlx::query(
            "INSERT INTO audit_events (plan_id, dead_letter_id, message_key, message_id, destination, \
                                       action, wave, executor_id, attempt) \
             SELECT id, g, 'added-' || g, 'm-' || g, 'orders', 'sent', 'main', 'keyless-test', 1 \
             FROM plans, generate_series($1::bigint, $2::bigint) g",
        )
        .bind(from)
        .bind(to)
    };
    insert(1, 40).execute(&pool).await?;
    let (size_before, queued) = log_state(&pool).await?;
    assert!(queued >= 40, "{queued} queued");
    let mut keyed = planner_process(&db_url, &keys)?;
    let refused = || async {
        anyhow::Ok(
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit_log_refused")
                .fetch_one(&pool)
                .await?,
        )
    };
    wait_until(
        "the rows left queued sealed",
        Duration::from_secs(30),
        || async { Ok(log_state(&pool).await?.1 == 0) },
    )
    .await?;
    let (size_after, _) = log_state(&pool).await?;
    let refused_then = refused().await?;
    // Written without a MAC after the key was taken: refused.
    insert(41, 41).execute(&pool).await?;
    wait_until("the late row judged", Duration::from_secs(30), || async {
        Ok(log_state(&pool).await?.1 == 0)
    })
    .await?;
    let refused_late = refused().await?;
    kill_9(&mut keyed).await?;
    assert_eq!(refused_then, 0, "none of the rows left queued was refused");
    assert_eq!(size_after - size_before, queued, "each sealed once");
    assert_eq!(
        refused_late, 1,
        "a row without a MAC after the key was taken"
    );
    pool.close().await;
    bed.finish().await
}

/// A backlog of audit events meets the sealing query planned while the
/// queue was small: statistics taken then, no autovacuum to refresh them (a
/// burst outruns it), and a plan made once and reused (a prepared
/// statement's generic plan). Each round still takes its batch by the
/// queue's index; the round that re-ran its `LIMIT` subquery per queued row
/// took minutes for this backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_events_seals_under_a_plan_made_while_the_queue_was_small()
-> anyhow::Result<()> {
    init_logging();
    let keys = Keys::new("redrive.test/backlog")?;
    let settings = keys.settings();
    let mut bed = TestBed::without_broker(|config| config.audit_log = settings).await?;
    let db_url = bed.db.url();
    let plan = one_plan(&mut bed.client, "backlog").await?;
    let pool = bed.pool().await?;
    let before = sealed(&pool).await?;
    bed.planner.halt().await?;
    // This test's own database: statistics of the small log, kept.
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await?;
    support::keep_statistics_of_now(&pool, &["audit_log_pending", "audit_events", "audit_log"])
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" SET plan_cache_mode = force_generic_plan"
    )))
    .execute(&pool)
    .await?;
    // 60,000 `sent` events written as a planner writes them (its
    // connections carry the MAC key): six full rounds queued.
    let writer = mac_writer(&db_url, &keys).await?;
    sqlx::query(
        "INSERT INTO audit_events (plan_id, dead_letter_id, message_key, message_id, destination, \
                                   action, wave, executor_id, attempt) \
         SELECT $1, g, 'backlog-' || g, 'm-' || g, 'orders', 'sent', 'main', 'backlog-test', 1 \
         FROM generate_series(1, 60000) g",
    )
    .bind(plan.plan_id.parse::<uuid::Uuid>()?)
    .execute(&writer)
    .await?;
    writer.close().await;
    let (_, queued) = log_state(&pool).await?;
    assert_eq!(queued, 60_000);

    // A planner process started now plans every statement generically.
    let mut planner = planner_process(&db_url, &keys)?;
    let size = sealed(&pool).await?;
    kill_9(&mut planner).await?;
    assert_eq!(size, before + 60_000);
    let refused: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log_refused")
        .fetch_one(&pool)
        .await?;
    assert_eq!(refused, 0);
    let settings = keys.settings();
    bed.restart_planner(|config| {
        config.audit_log = settings;
        config.audit_log.witness_dir = None;
    })
    .await?;
    let report = verified(&mut bed.client, &keys, &[]).await?;
    assert!(report.is_valid(), "{:?}", problems(&report));
    assert_eq!(report.leaves_checked, size);
    pool.close().await;
    bed.finish().await
}

/// A witness over HTTP: each request's body, answered 200 (or 503 while
/// `refusing` holds).
async fn witness_server(
    refusing: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<(
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let sender = sender.clone();
            let refusing = refusing.clone();
            tokio::spawn(async move {
                let mut data = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let Ok(read) = stream.read(&mut buffer).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    data.extend_from_slice(&buffer[..read]);
                    let text = String::from_utf8_lossy(&data).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let length = head
                        .lines()
                        .find_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() < length {
                        continue;
                    }
                    let refused = refusing.load(std::sync::atomic::Ordering::SeqCst);
                    let status = if refused {
                        "503 Service Unavailable"
                    } else {
                        "200 OK"
                    };
                    let _ = stream
                        .write_all(
                            format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes(),
                        )
                        .await;
                    if !refused {
                        let _ = sender.send((head.to_owned(), body.to_owned()));
                    }
                    return;
                }
            });
        }
    });
    Ok((addr, receiver))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_new_checkpoint_reaches_a_witness_url_also_after_it_refused_one() -> anyhow::Result<()>
{
    init_logging();
    let keys = Keys::new("redrive.test/witness")?;
    let refusing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (addr, mut received) = witness_server(refusing.clone()).await?;
    let mut settings = keys.settings();
    settings.witness_url = Some(format!("http://{addr}/checkpoint"));
    let mut bed = TestBed::without_broker(|config| config.audit_log = settings).await?;
    let plan = one_plan(&mut bed.client, "witness").await?;
    // The witness refuses for a while: nothing is lost, the planner pushes
    // the latest checkpoint again once it answers.
    let pool = bed.pool().await?;
    sealed(&pool).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    refusing.store(false, std::sync::atomic::Ordering::SeqCst);
    let (head, body) = tokio::time::timeout(Duration::from_secs(20), received.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the witness server stopped"))?;
    assert!(head.starts_with("POST /checkpoint HTTP/1.1"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    let pushed = open_checkpoint(&body, &keys.verifier)?;
    let latest = bed
        .client
        .get_audit_checkpoint(GetAuditCheckpointRequest::default())
        .await?
        .into_inner();
    assert_eq!(body, latest.note);
    assert_eq!(pushed.size, latest.tree_size);
    // A later action makes a later checkpoint, pushed too.
    bed.client
        .cancel_plan(v1::PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: "not needed".into(),
            ..Default::default()
        })
        .await?;
    let (_, body) = tokio::time::timeout(Duration::from_secs(20), received.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the witness server stopped"))?;
    let later = open_checkpoint(&body, &keys.verifier)?;
    assert!(
        later.size > pushed.size,
        "{} after {}",
        later.size,
        pushed.size
    );
    // The witness directory holds it too.
    let held = std::fs::read_to_string(keys.witness().join("checkpoint"))?;
    assert!(open_checkpoint(&held, &keys.verifier)?.size >= later.size);
    pool.close().await;
    bed.finish().await
}

/// A rotation on a log that has not grown since the old key's latest
/// checkpoint: the new key's planner adds its signature to that checkpoint
/// at once (a second signature line), so the new verifier key opens the
/// log's latest checkpoint without waiting for the log to grow, the old key
/// still does, the witness is sent it again, and nothing else changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_on_an_idle_log_cosigns_its_latest_checkpoint() -> anyhow::Result<()> {
    init_logging();
    let old = Keys::new("redrive.test/old")?;
    let new = Keys::new("redrive.test/new")?;
    let settings = old.settings();
    let mut bed = TestBed::without_broker(|config| config.audit_log = settings).await?;
    one_plan(&mut bed.client, "idle-rotation").await?;
    let pool = bed.pool().await?;
    let size = sealed(&pool).await?;
    let latest = || async {
        anyhow::Ok(
            sqlx::query_as::<_, (i64, String, i64)>(
                "SELECT tree_size, note, (SELECT count(*) FROM audit_checkpoints) \
                 FROM audit_checkpoints ORDER BY tree_size DESC LIMIT 1",
            )
            .fetch_one(&pool)
            .await?,
        )
    };
    let (_, old_note, checkpoints) = latest().await?;
    assert!(open_checkpoint(&old_note, &new.verifier).is_err());
    let witnessed = || std::fs::read_to_string(old.witness().join("checkpoint"));
    wait_until("the witness", Duration::from_secs(20), || async {
        Ok(witnessed().is_ok_and(|note| note == old_note))
    })
    .await?;

    let mut rotated = new.settings();
    rotated.previous_key = Some(old.key_file.clone());
    rotated.witness_dir = Some(old.witness());
    bed.restart_planner(|config| config.audit_log = rotated)
        .await?;
    wait_until(
        "the latest checkpoint cosigned",
        Duration::from_secs(20),
        || async { Ok(open_checkpoint(&latest().await?.1, &new.verifier).is_ok()) },
    )
    .await?;
    let (cosigned_size, cosigned, count) = latest().await?;
    assert_eq!(u64::try_from(cosigned_size)?, size, "the same tree");
    assert_eq!(count, checkpoints, "no new checkpoint");
    assert!(
        cosigned.starts_with(&old_note),
        "the old signature kept: {cosigned}"
    );
    let by_old = open_checkpoint(&cosigned, &old.verifier)?;
    let by_new = open_checkpoint(&cosigned, &new.verifier)?;
    assert_eq!(by_old, by_new);
    assert_eq!(by_new.size, size);
    wait_until(
        "the witness sent it again",
        Duration::from_secs(20),
        || async { Ok(witnessed().is_ok_and(|note| note == cosigned)) },
    )
    .await?;
    // An auditor with only the new key verifies the whole log, against
    // the witness's copy too.
    let report = verified(&mut bed.client, &new, &[witnessed()?]).await?;
    assert!(report.is_valid(), "{:?}", problems(&report));
    assert_eq!(report.leaves_checked, size);
    // Once is enough: it stays as it is.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(latest().await?.1, cosigned);
    pool.close().await;
    bed.finish().await
}
