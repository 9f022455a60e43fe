//! Operator experience (issue 17): what a person sees of `redrivectl` in an
//! 80-column terminal, with `--json`, in a spreadsheet, and in their shell.

mod support;

use support::*;

/// Every header word a table may print: a header cut mid-word is not one.
const HEADER_WORDS: &[&str] = &[
    "ID",
    "SOURCE",
    "REASON_CLASS",
    "DEATH_REASON",
    "DESTINATION",
    "EVENT_TYPE",
    "MESSAGE_KEY",
    "MESSAGE_ID",
    "BODY_SIZE",
    "DIED_AT",
    "DEAD_LETTER_ID",
    "VERDICT",
    "REASON",
    "PLAN_ID",
    "STATE",
    "DONE",
    "RATE",
    "CREATED_BY",
    "CREATED_AT",
    "ACTION",
    "COUNT",
    "VALUE",
    "TOTAL",
    "REPLAYABLE",
    "DUPLICATE",
    "BLOCKED_BY_STATE",
    "WAVE",
    "AT",
    "ACTOR",
    "FIRST_SEEN",
    "LAST_SEEN",
    "PRODUCER",
    "HOUR",
    "KIND",
];

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// What an 80-column terminal needs of every table in `text` (a header line
/// of upper-case words and the lines up to the next blank one): no line over
/// 80 characters, and headers made of whole words. Returns how many tables
/// there were.
fn assert_fits_80(text: &str) -> usize {
    let mut tables = 0;
    let mut in_table = false;
    for line in text.lines() {
        let header = !line.is_empty()
            && line.starts_with(|c: char| c.is_ascii_uppercase())
            && line
                .split_whitespace()
                .all(|word| word.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
        if header {
            tables += 1;
            in_table = true;
            for word in line.split_whitespace() {
                assert!(
                    HEADER_WORDS.contains(&word),
                    "header word {word:?} cut: {line:?}\n{text}"
                );
            }
        } else if line.trim().is_empty() {
            in_table = false;
        }
        if in_table {
            assert!(
                line.chars().count() <= 80,
                "{} columns: {line:?}\n{text}",
                line.chars().count()
            );
        }
    }
    tables
}

async fn run_80(address: SocketAddr, args: &[&str]) -> Output {
    redrivectl_with_env(
        address,
        args,
        "",
        &[("USER", Some("tester")), ("COLUMNS", Some("80"))],
    )
    .await
}

#[tokio::test]
async fn dead_letters_list_fits_80_columns_and_wide_shows_everything() {
    let address = serve(Fake::default()).await;
    let output = run_80(address, &["dead-letters", "list", "--source", "long"]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(assert_fits_80(&text), 1, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "ID",
            "MESSAGE_ID",
            "SOURCE",
            "REASON_CLASS",
            "EVENT_TYPE",
            "DIED_AT"
        ],
        "{text}"
    );
    // Ids and times whole, long names and ids shortened with an ellipsis;
    // the message key gives way to the message id people know.
    for whole in ["1234567", "exhausted", "2025-12-01T08:00:00.123Z"] {
        assert!(lines[1].contains(whole), "{whole}: {text}");
    }
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert!(
        cells[1].starts_with("m-9f") && cells[1].ends_with('…'),
        "{text}"
    );
    assert!(
        cells[2].starts_with("paym") && cells[2].ends_with('…'),
        "{text}"
    );
    assert!(
        cells[4].starts_with("payment.") && cells[4].ends_with('…'),
        "{text}"
    );
    assert!(!text.contains("MESSAGE_KEY"), "{text}");

    let wide = run_80(
        address,
        &["dead-letters", "list", "--source", "long", "--wide"],
    )
    .await;
    let text = stdout(&wide);
    for whole in [
        "DEATH_REASON",
        "BODY_SIZE",
        "payments.settlement.dead-letter-queue",
        "order-9f86d081884c7d659a2feaa0c55ad015:capture",
        "m-9f86d081884c7d659a2feaa0c55ad015",
        "payment.settlement.captured",
        "delivery_limit",
        "16777216",
    ] {
        assert!(text.contains(whole), "{whole}: {text}");
    }
    assert!(!text.contains('…'), "{text}");
}

#[tokio::test]
async fn the_summary_fits_80_columns_with_hours_as_every_time() {
    let address = serve(Fake::default()).await;
    let args = [
        "dead-letters",
        "summary",
        "--source",
        "long",
        "--group-by",
        "reason,producer,event_type,hour",
    ];
    let output = run_80(address, &args).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(assert_fits_80(&text), 1, "{text}");
    assert!(text.contains("2026-11-29T14:00:00.000Z"), "{text}");
    // No room for the first and last seen times: --wide has them.
    assert!(!text.contains("LAST_SEEN"), "{text}");
    let mut wide_args = args.to_vec();
    wide_args.push("--wide");
    let wide = stdout(&run_80(address, &wide_args).await);
    for whole in [
        "FIRST_SEEN",
        "2025-11-29T14:00:00.987Z",
        "2025-11-29T14:59:59.000Z",
        "payments-settlement-service.eu-west-1",
    ] {
        assert!(wide.contains(whole), "{whole}: {wide}");
    }
    assert!(
        text.ends_with("open: 12, archived: 3, replayed: 0\ntotal: 12\n"),
        "{text}"
    );

    let mut json_args = vec!["--json"];
    json_args.extend(args);
    // The API's SummarizeDeadLettersResponse: uint64 counts as strings, a
    // zero left out, the group key as the planner wrote it.
    let json = stdout_json(&redrivectl(address, &json_args, "").await);
    assert_eq!(
        (&json["open"], &json["archived"], json.get("replayed")),
        (&serde_json::json!("12"), &serde_json::json!("3"), None)
    );
    assert_eq!(json["groups"][0]["key"]["hour"], "2026-11-29T14:00Z");
    assert_eq!(
        json["groups"][0]["firstSeen"],
        "2025-11-29T14:00:00.987654321Z"
    );
    assert_eq!(
        json["groups"][0]["key"]["producer"],
        "payments-settlement-service.eu-west-1"
    );
}

#[tokio::test]
async fn every_plan_and_precheck_table_fits_80_columns() {
    let address = serve(Fake::default()).await;
    for args in [
        &["plan", "list"][..],
        &["plan", "status", "plan-done"],
        &["plan", "report", "plan-done"],
        &["plan", "compensations", "plan-1"],
        &["precheck", "show", PRECHECK_ID],
        &["precheck", "items", PRECHECK_ID],
    ] {
        let output = run_80(address, args).await;
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert!(assert_fits_80(&stdout(&output)) > 0, "{args:?}: no table");
    }
}

#[tokio::test]
async fn times_have_milliseconds_and_z_everywhere() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["--json", "dead-letters", "show", "long"], "").await;
    // JSON is the API's canonical JSON: RFC 3339 in UTC, as many fractional
    // digits (0, 3, 6 or 9) as the time has.
    let json = stdout_json(&output);
    assert_eq!(
        json["deadLetter"]["diedAt"],
        "2025-12-01T08:00:00.123456789Z"
    );
    assert_eq!(
        json["deadLetter"]["capturedAt"],
        "2025-12-01T08:00:01.000005Z"
    );
    let text = stdout(&redrivectl(address, &["dead-letters", "show", "long"], "").await);
    assert!(
        text.lines()
            .any(|line| line.starts_with("died at:") && line.ends_with(" 2025-12-01T08:00:00.123Z")),
        "{text}"
    );
    // Every RFC 3339 time printed for people has the one form.
    let plan = stdout(&redrivectl(address, &["plan", "status", "plan-done"], "").await);
    let report = stdout(&redrivectl(address, &["plan", "report", "plan-done"], "").await);
    for text in [&plan, &report] {
        for (index, _) in text.match_indices("T0").chain(text.match_indices("T1")) {
            let start = index.saturating_sub(10);
            let time: String = text[start..].chars().take(24).collect();
            if time.as_bytes().get(4) == Some(&b'-') {
                assert!(
                    time.len() == 24 && time.ends_with('Z') && time.as_bytes()[19] == b'.',
                    "{time:?} in {text}"
                );
            }
        }
    }
}

/// A line break in an archive reason, a capture note or a header printed
/// raw: the line after it, `status: open`, read like the dead letter's own
/// status. Every further line of such a text is indented.
#[tokio::test]
async fn line_breaks_in_texts_cannot_pass_for_fields() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["dead-letters", "show", "spoof"], "").await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let statuses: Vec<&str> = text
        .lines()
        .filter(|line| line.trim_start().starts_with("status:"))
        .collect();
    // The real field, then the spoofs (archived, the header's name and
    // value, the capture note, the archive record), each indented deeper
    // than the field, record or header it belongs to.
    assert!(statuses.len() >= 5, "{text}");
    assert!(statuses[0].starts_with("status:"), "{text}");
    for spoof in &statuses[1..] {
        assert!(spoof.starts_with("    "), "{spoof:?} in {text}");
    }
}

#[tokio::test]
async fn show_escapes_binary_bodies_and_keeps_json_key_order() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["dead-letters", "show", "bin"], "").await;
    assert!(output.status.success(), "{}", stderr(&output));
    // No control byte reaches the terminal but line ends.
    assert!(
        !output
            .stdout
            .iter()
            .any(|byte| (*byte < 0x20 && *byte != b'\n') || *byte == 0x7f),
        "{:?}",
        stdout(&output)
    );
    let text = stdout(&output);
    assert!(
        text.contains("\\x00\\x1b[2J\\x1b]52;c;aGk=\\x07\\xff\\xfe\\x9b tail"),
        "{text}"
    );
    assert!(text.contains("[binary: not UTF-8"), "{text}");

    let output = redrivectl(address, &["dead-letters", "show", "json"], "").await;
    let text = stdout(&output);
    let body = &text[text.find("\n{").unwrap() + 1..];
    assert_eq!(
        body,
        "{\n  \"order_id\": \"o-1\",\n  \"amount\": {\n    \"value\": 12.50,\n    \"currency\": \"EUR\"\n  },\n  \"customer\": \"c-9\"\n}\n"
    );
    // --json is the API's GetDeadLetterResponse: the planner's preview, and
    // the exact body (base64), keys in the producer's order.
    let json =
        stdout_json(&redrivectl(address, &["--json", "dead-letters", "show", "json"], "").await);
    let body = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        json["deadLetter"]["body"].as_str().unwrap(),
    )
    .unwrap();
    assert!(body.starts_with(b"{\"order_id\""), "{json}");
    assert!(json["bodyPreview"].is_string(), "{json}");
}

fn json_error(output: &Output) -> serde_json::Value {
    assert!(output.stdout.is_empty(), "{}", stdout(output));
    let text = stderr(output);
    assert_eq!(text.lines().count(), 1, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"))
}

#[tokio::test]
async fn errors_are_json_on_stderr_with_json() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["--json", "dead-letters", "show", "42"], "").await;
    assert_eq!(output.status.code(), Some(65));
    assert_eq!(
        json_error(&output),
        serde_json::json!({"error": {"code": "not_found", "message": "dead letter 42 not found"}})
    );

    // REDRIVE_JSON=1 is --json.
    let output = redrivectl_with_env(
        address,
        &["dead-letters", "show", "42"],
        "",
        &[("REDRIVE_JSON", Some("1"))],
    )
    .await;
    assert_eq!(output.status.code(), Some(65));
    assert_eq!(json_error(&output)["error"]["code"], "not_found");
    let output = redrivectl_with_env(
        address,
        &["dead-letters", "list"],
        "",
        &[("REDRIVE_JSON", Some("1"))],
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout_json(&output)["deadLetters"][0]["id"], "1");
    // Empty or a false word is off.
    for off in ["", "0", "false", "off"] {
        let output = redrivectl_with_env(
            address,
            &["dead-letters", "show", "42"],
            "",
            &[("REDRIVE_JSON", Some(off))],
        )
        .await;
        assert_eq!(output.status.code(), Some(65), "{off:?}");
        assert_eq!(
            stderr(&output),
            "redrivectl: not_found: dead letter 42 not found\n",
            "{off:?}"
        );
    }

    // Usage errors too, with the usual exit code.
    let output = redrivectl(address, &["--json", "plan", "approve", "p-1"], "").await;
    assert_eq!(output.status.code(), Some(64));
    let error = json_error(&output);
    assert_eq!(error["error"]["code"], "usage");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--digest"),
        "{error}"
    );

    // Without --json: one line of text, as before.
    let output = redrivectl(address, &["dead-letters", "show", "42"], "").await;
    assert_eq!(output.status.code(), Some(65));
    assert_eq!(
        stderr(&output),
        "redrivectl: not_found: dead letter 42 not found\n"
    );
}

#[tokio::test]
async fn an_unreachable_planner_is_a_json_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let output = redrivectl(address, &["--json", "plan", "status", "p-1"], "").await;
    assert_eq!(output.status.code(), Some(69));
    let error = json_error(&output);
    assert_eq!(error["error"]["code"], "unreachable");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&address.to_string()),
        "{error}"
    );
}

#[tokio::test]
async fn usage_errors_name_only_what_is_missing_and_host_port_is_a_planner() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["plan", "approve"], "").await;
    assert_eq!(output.status.code(), Some(64));
    let text = stderr(&output);
    assert!(text.contains("<ID>") && text.contains("--digest"), "{text}");
    for global in ["--planner", "--actor", "--json", "--wide", "--profile"] {
        assert!(!text.contains(global), "{global} listed: {text}");
    }

    // --planner HOST:PORT, as grpcurl takes it.
    let output = redrivectl_with_env(
        address,
        &["--planner", &address.to_string(), "dead-letters", "list"],
        "",
        &[("REDRIVE_PLANNER", None)],
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
}

/// The planner's export is made safe for spreadsheets by the planner
/// (`planner/src/audit.rs`, `export_rows_are_safe_in_a_spreadsheet`); the
/// CLI writes it as it streams in, byte for byte, so the file stays safe.
#[tokio::test]
async fn csv_and_jsonl_exports_are_safe_in_a_spreadsheet() {
    let address = serve(Fake::default()).await;
    let csv = redrivectl(
        address,
        &["plan", "report", "plan-formula", "--format", "csv"],
        "",
    )
    .await;
    assert!(csv.status.success(), "{}", stderr(&csv));
    assert_eq!(csv.stdout, support::FORMULA_CSV);
    let mut reader = ::csv::ReaderBuilder::new().from_reader(csv.stdout.as_slice());
    let rows: Vec<Vec<String>> = reader
        .records()
        .map(|record| record.unwrap().iter().map(str::to_owned).collect())
        .collect();
    assert_eq!(
        rows,
        [
            [
                "2024-05-01T12:10:00.000Z",
                "plan-formula",
                "'=HYPERLINK(\"http://x\",\"y\")",
                "failed",
                "'+1 nack"
            ],
            [
                "2024-05-01T12:10:00.500Z",
                "plan-formula",
                "'@SUM(A1)",
                "sent",
                "'-2"
            ],
            [
                "2024-05-01T12:10:01.000Z",
                "plan-formula",
                "'\tkey",
                "sent",
                "'\rcr"
            ],
        ]
    );

    let jsonl = redrivectl(
        address,
        &["plan", "report", "plan-formula", "--format", "jsonl"],
        "",
    )
    .await;
    let text = stdout(&jsonl);
    assert_eq!(
        text,
        "{\"at\":\"2024-05-01T12:10:00.000Z\",\"attempt\":-1,\"message_key\":\"'=HYPERLINK(1)\"}\n"
    );
}

#[tokio::test]
async fn completions_and_the_man_page_are_generated() {
    let address = serve(Fake::default()).await;
    for (shell, mark) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef redrivectl"),
        ("fish", "complete -c redrivectl"),
    ] {
        let output = redrivectl(address, &["completion", shell], "").await;
        assert!(output.status.success(), "{shell}: {}", stderr(&output));
        let script = stdout(&output);
        assert!(script.contains(mark), "{shell}: {script}");
        for word in ["dead-letters", "precheck", "approve", "planner", "wide"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let output = redrivectl(address, &["completion", "tcsh"], "").await;
    assert_eq!(output.status.code(), Some(64));

    let man = redrivectl(address, &["man"], "").await;
    assert!(man.status.success());
    let page = stdout(&man);
    assert!(
        page.starts_with(".ie") || page.contains(".TH redrivectl"),
        "{page}"
    );
    for word in ["dead\\-letters", "\\-\\-planner", "REDRIVE_PLANNER"] {
        assert!(page.contains(word), "man page lacks {word}");
    }
}

#[tokio::test]
async fn profiles_come_from_the_config_file_and_flags_win() {
    let (fake, address) = served().await;
    let config = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(config.path().join("redrive")).unwrap();
    std::fs::write(
        config.path().join("redrive/config.toml"),
        format!(
            "planner = \"127.0.0.1:9\"\n\n[profiles.local]\nplanner = \"{address}\"\nactor = \"carol\"\n"
        ),
    )
    .unwrap();
    let xdg = config.path().to_str().unwrap();
    let env = |profile| {
        [
            ("USER", Some("tester")),
            ("REDRIVE_PLANNER", None),
            ("XDG_CONFIG_HOME", Some(xdg)),
            ("REDRIVE_PROFILE", profile),
        ]
    };
    // The profile's planner and actor.
    let output = redrivectl_with_env(
        address,
        &["--profile", "local", "dead-letters", "list"],
        "",
        &env(None),
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    let output =
        redrivectl_with_env(address, &["dead-letters", "list"], "", &env(Some("local"))).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        fake.actors()
            .iter()
            .all(|(_, actor)| actor.as_deref() == Some("carol")),
        "{:?}",
        fake.actors()
    );
    // Without a profile: the top-level planner, where nothing listens.
    let output = redrivectl_with_env(address, &["dead-letters", "list"], "", &env(None)).await;
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("127.0.0.1:9"),
        "{}",
        stderr(&output)
    );
    // A flag wins over the file.
    let output = redrivectl_with_env(
        address,
        &["--planner", &address.to_string(), "dead-letters", "list"],
        "",
        &env(None),
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    // An unknown profile is a config error.
    let output = redrivectl_with_env(
        address,
        &["--json", "--profile", "prod", "dead-letters", "list"],
        "",
        &env(None),
    )
    .await;
    assert_eq!(output.status.code(), Some(78));
    let error = json_error(&output);
    assert_eq!(error["error"]["code"], "config");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("profiles: local"),
        "{error}"
    );
}
