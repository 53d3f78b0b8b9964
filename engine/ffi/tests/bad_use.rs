//! Bad use of the C ABI returns an error code and never crashes: null handles and pointers,
//! a handle used after it was destroyed (or of another kind), a buffer too small, a send on a
//! closed session, an invalid config, a panic inside the library.

use std::ffi::{c_char, CStr};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use ricochet_ffi::client::*;
use ricochet_ffi::server::*;
use ricochet_ffi::token::*;
use ricochet_ffi::*;
use ricochet_status::*;

fn last_error() -> String {
    let mut buf = [0 as c_char; 512];
    let mut len = 0usize;
    // SAFETY: a buffer of 512 bytes and a length slot.
    let s = unsafe { ricochet_last_error(buf.as_mut_ptr(), buf.len(), &mut len) };
    assert_eq!(s, RICOCHET_OK);
    // SAFETY: NUL-terminated by the call.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn insecure_server(workers: u32) -> ricochet_server {
    insecure_server_with(workers, |_| {})
}

fn insecure_server_with(
    workers: u32,
    tune: impl FnOnce(&mut ricochet_server_config),
) -> ricochet_server {
    let mut cfg = std::mem::MaybeUninit::uninit();
    assert_eq!(
        // SAFETY: writable config.
        unsafe { ricochet_server_config_default(cfg.as_mut_ptr()) },
        RICOCHET_OK
    );
    // SAFETY: initialized by the call above.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.bind = c"127.0.0.1:0".as_ptr();
    cfg.admission = RICOCHET_ADMISSION_INSECURE;
    cfg.workers = workers;
    tune(&mut cfg);
    let mut server = ricochet_server { id: 0 };
    assert_eq!(
        // SAFETY: valid config and out slot.
        unsafe { ricochet_server_start(&cfg, &mut server) },
        RICOCHET_OK
    );
    server
}

fn local_address(server: ricochet_server) -> std::ffi::CString {
    let mut buf = [0 as c_char; 64];
    // SAFETY: a buffer of 64 bytes.
    let s = unsafe { ricochet_server_local_address(server, buf.as_mut_ptr(), 64, null_mut()) };
    assert_eq!(s, RICOCHET_OK);
    // SAFETY: NUL-terminated by the call.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_owned()
}

fn empty_client_event() -> ricochet_client_event {
    ricochet_client_event {
        kind: ricochet_event_kind::RICOCHET_EVENT_NONE,
        channel: 0,
        by_peer: 0,
        reason: 0,
        len: 0,
    }
}

fn empty_server_event() -> ricochet_server_event {
    ricochet_server_event {
        kind: ricochet_event_kind::RICOCHET_EVENT_NONE,
        session: ricochet_session { worker: 0, id: 0 },
        channel: 0,
        by_peer: 0,
        reason: 0,
        has_client_id: 0,
        client_id: 0,
        len: 0,
    }
}

/// Poll the server until an event of `kind` comes (bounded).
fn server_event(
    server: ricochet_server,
    kind: ricochet_event_kind,
    buf: &mut [u8],
) -> ricochet_server_event {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no {kind:?} event");
        let mut ev = empty_server_event();
        // SAFETY: event slot and buffer of buf.len() bytes.
        let s = unsafe {
            ricochet_server_poll(
                server,
                RICOCHET_ANY_WORKER,
                &mut ev,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        assert_eq!(s, RICOCHET_OK);
        if ev.kind == kind {
            return ev;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Update the client until an event of `kind` comes (bounded).
fn client_event(client: ricochet_client, kind: ricochet_event_kind) -> ricochet_client_event {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no {kind:?} event");
        assert_eq!(ricochet_client_update(client, 2), RICOCHET_OK);
        let mut ev = empty_client_event();
        let mut buf = [0u8; 2048];
        // SAFETY: event slot and a 2 KiB buffer.
        let s = unsafe { ricochet_client_poll(client, &mut ev, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(s, RICOCHET_OK);
        if ev.kind == kind {
            return ev;
        }
    }
}

#[test]
fn null_handles_and_pointers_return_errors() {
    let null_client = ricochet_client { id: 0 };
    let null_server = ricochet_server { id: 0 };
    let mut ev = empty_client_event();
    // SAFETY (every call below): null or valid pointers only; the library checks the rest.
    // SAFETY: valid pointers (or deliberately null ones, which the library checks).
    unsafe {
        assert_eq!(
            ricochet_client_send(null_client, 0, b"x".as_ptr(), 1),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            ricochet_client_update(null_client, 0),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            ricochet_client_poll(null_client, &mut ev, null_mut(), 0),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            ricochet_client_close(null_client),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            ricochet_client_destroy(null_client),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        let session = ricochet_session { worker: 0, id: 1 };
        assert_eq!(
            ricochet_server_send(null_server, session, 0, null(), 0),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            ricochet_server_close_session(null_server, session),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            ricochet_server_stop(null_server),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            ricochet_token_issuer_destroy(ricochet_token_issuer { id: 0 }),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        // A made-up handle is no better than a null one.
        assert_eq!(
            ricochet_client_update(
                ricochet_client {
                    id: 0xdead_beef_0000_0001
                },
                0
            ),
            RICOCHET_ERROR_INVALID_HANDLE
        );
        // Null pointers where the library needs one.
        assert_eq!(
            ricochet_client_connect(null(), 0, null(), null_mut()),
            RICOCHET_ERROR_NULL_POINTER
        );
        let mut c = ricochet_client { id: 0 };
        assert_eq!(
            ricochet_client_connect(null(), 10, null(), &mut c),
            RICOCHET_ERROR_NULL_POINTER
        );
        assert_eq!(
            ricochet_client_connect_insecure(null(), null(), &mut c),
            RICOCHET_ERROR_NULL_POINTER
        );
        assert_eq!(
            ricochet_server_start(null(), null_mut()),
            RICOCHET_ERROR_NULL_POINTER
        );
        assert_eq!(
            ricochet_token_issuer_new(null(), 1, 0, null_mut()),
            RICOCHET_ERROR_NULL_POINTER
        );
        assert_eq!(c.id, 0, "nothing was written on failure");
    }
    assert!(last_error().contains("null"), "{}", last_error());
    // SAFETY: static strings.
    let text = unsafe { CStr::from_ptr(ricochet_error_text(RICOCHET_ERROR_INVALID_HANDLE as i32)) };
    assert!(text.to_str().unwrap().contains("invalid handle"));
    // SAFETY: valid pointers (or deliberately null ones, which the library checks).
    let version = unsafe { CStr::from_ptr(ricochet_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn a_handle_used_after_it_was_destroyed_or_stopped_returns_an_error() {
    let server = insecure_server(1);
    let addr = local_address(server);
    let mut client = ricochet_client { id: 0 };
    assert_eq!(
        // SAFETY: valid address string and out slot.
        unsafe { ricochet_client_connect_insecure(addr.as_ptr(), null(), &mut client) },
        RICOCHET_OK
    );
    client_event(client, ricochet_event_kind::RICOCHET_EVENT_CONNECTED);
    // A handle of one kind is not a handle of another.
    assert_eq!(
        ricochet_server_stop(ricochet_server { id: client.id }),
        RICOCHET_ERROR_INVALID_HANDLE
    );
    assert_eq!(ricochet_client_destroy(client), RICOCHET_OK);
    // SAFETY: valid pointers; the handle is stale.
    unsafe {
        assert_eq!(
            ricochet_client_send(client, 0, b"x".as_ptr(), 1),
            RICOCHET_ERROR_INVALID_HANDLE
        );
    }
    assert_eq!(
        ricochet_client_update(client, 0),
        RICOCHET_ERROR_INVALID_HANDLE
    );
    assert_eq!(
        ricochet_client_destroy(client),
        RICOCHET_ERROR_INVALID_HANDLE
    );
    // A new object in the freed slot does not answer to the old handle.
    let mut issuer = ricochet_token_issuer { id: 0 };
    assert_eq!(
        // SAFETY: a 32-byte key and an out slot.
        unsafe { ricochet_token_issuer_new([1u8; 32].as_ptr(), 1, 0, &mut issuer) },
        RICOCHET_OK
    );
    assert_ne!(issuer.id, client.id);
    assert_eq!(ricochet_client_close(client), RICOCHET_ERROR_INVALID_HANDLE);
    assert_eq!(ricochet_token_issuer_destroy(issuer), RICOCHET_OK);

    assert_eq!(ricochet_server_stop(server), RICOCHET_OK);
    assert_eq!(ricochet_server_stop(server), RICOCHET_ERROR_INVALID_HANDLE);
    let mut ev = empty_server_event();
    // SAFETY: valid event slot.
    let s = unsafe { ricochet_server_poll(server, RICOCHET_ANY_WORKER, &mut ev, null_mut(), 0) };
    assert_eq!(s, RICOCHET_ERROR_INVALID_HANDLE);
}

#[test]
fn a_buffer_too_small_keeps_the_event_and_says_the_size_needed() {
    let server = insecure_server(1);
    let addr = local_address(server);
    let mut client = ricochet_client { id: 0 };
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { ricochet_client_connect_insecure(addr.as_ptr(), null(), &mut client) },
        RICOCHET_OK
    );
    client_event(client, ricochet_event_kind::RICOCHET_EVENT_CONNECTED);
    let message = [7u8; 100];
    assert_eq!(
        // SAFETY: 100 readable bytes.
        unsafe { ricochet_client_send(client, 1, message.as_ptr(), 100) },
        RICOCHET_OK
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut small = [0u8; 10];
    let ev = loop {
        assert!(Instant::now() < deadline, "no message");
        assert_eq!(ricochet_client_update(client, 1), RICOCHET_OK);
        let mut ev = empty_server_event();
        // SAFETY: a 10-byte buffer.
        let s = unsafe { ricochet_server_poll(server, 0, &mut ev, small.as_mut_ptr(), 10) };
        if ev.kind == ricochet_event_kind::RICOCHET_EVENT_MESSAGE {
            assert_eq!(s, RICOCHET_ERROR_BUFFER_TOO_SMALL);
            break ev;
        }
        assert_eq!(s, RICOCHET_OK);
    };
    assert_eq!((ev.len, ev.channel), (100, 1));
    assert!(
        last_error().contains("100 bytes needed"),
        "{}",
        last_error()
    );
    // The message is still there for a call with room.
    let mut big = [0u8; 100];
    let ev = server_event(
        server,
        ricochet_event_kind::RICOCHET_EVENT_MESSAGE,
        &mut big,
    );
    assert_eq!((ev.len, &big[..]), (100, &message[..]));
    // An out-of-range worker is an invalid argument.
    let mut e = empty_server_event();
    // SAFETY: valid event slot.
    let s = unsafe { ricochet_server_poll(server, 9, &mut e, null_mut(), 0) };
    assert_eq!(s, RICOCHET_ERROR_INVALID_ARGUMENT);

    // The same on the client side: the echo (sent back by hand) with no room.
    assert_eq!(
        // SAFETY: 100 readable bytes.
        unsafe { ricochet_server_send(server, ev.session, 1, message.as_ptr(), 100) },
        RICOCHET_OK
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no echo");
        assert_eq!(ricochet_client_update(client, 1), RICOCHET_OK);
        let mut ev = empty_client_event();
        // SAFETY: no buffer, capacity 0.
        let s = unsafe { ricochet_client_poll(client, &mut ev, null_mut(), 0) };
        if ev.kind == ricochet_event_kind::RICOCHET_EVENT_MESSAGE {
            assert_eq!((s, ev.len), (RICOCHET_ERROR_BUFFER_TOO_SMALL, 100));
            break;
        }
    }
    let mut ev = empty_client_event();
    let mut buf = [0u8; 100];
    // SAFETY: a 100-byte buffer.
    let s = unsafe { ricochet_client_poll(client, &mut ev, buf.as_mut_ptr(), 100) };
    assert_eq!(
        (s, ev.kind, ev.len, buf),
        (
            RICOCHET_OK,
            ricochet_event_kind::RICOCHET_EVENT_MESSAGE,
            100,
            message
        )
    );

    // Too small for the address text: the room needed comes back.
    let mut len = 0usize;
    let mut tiny = [0 as c_char; 4];
    // SAFETY: a 4-byte buffer and a length slot.
    let s = unsafe { ricochet_server_local_address(server, tiny.as_mut_ptr(), 4, &mut len) };
    assert_eq!(
        (s, len),
        (RICOCHET_ERROR_BUFFER_TOO_SMALL, addr.as_bytes().len() + 1)
    );
    // A token buffer too small.
    let mut issuer = ricochet_token_issuer { id: 0 };
    assert_eq!(
        // SAFETY: key and out slot.
        unsafe { ricochet_token_issuer_new([2u8; 32].as_ptr(), 1, 0, &mut issuer) },
        RICOCHET_OK
    );
    let servers = [addr.as_ptr()];
    let mut token = [0u8; 100];
    // SAFETY: one address pointer, a 100-byte buffer, a length slot.
    let s = unsafe {
        ricochet_token_issue(
            issuer,
            1,
            servers.as_ptr(),
            1,
            null(),
            0,
            token.as_mut_ptr(),
            100,
            &mut len,
        )
    };
    assert_eq!(
        (s, len),
        (RICOCHET_ERROR_BUFFER_TOO_SMALL, RICOCHET_CONNECT_TOKEN_LEN)
    );
    assert_eq!(ricochet_token_issuer_destroy(issuer), RICOCHET_OK);
    assert_eq!(ricochet_client_destroy(client), RICOCHET_OK);
    assert_eq!(ricochet_server_stop(server), RICOCHET_OK);
}

#[test]
fn a_send_on_a_closed_session_returns_closed() {
    let server = insecure_server(2);
    let addr = local_address(server);
    let mut client = ricochet_client { id: 0 };
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { ricochet_client_connect_insecure(addr.as_ptr(), null(), &mut client) },
        RICOCHET_OK
    );
    client_event(client, ricochet_event_kind::RICOCHET_EVENT_CONNECTED);
    let mut buf = [0u8; 64];
    let connected = server_event(
        server,
        ricochet_event_kind::RICOCHET_EVENT_CONNECTED,
        &mut buf,
    );
    let session = connected.session;
    // The server closes the session: sends to it fail at once, and the client learns why.
    assert_eq!(ricochet_server_close_session(server, session), RICOCHET_OK);
    // SAFETY: 1 readable byte.
    unsafe {
        assert_eq!(
            ricochet_server_send(server, session, 0, b"x".as_ptr(), 1),
            RICOCHET_ERROR_CLOSED
        );
    }
    assert_eq!(
        ricochet_server_close_session(server, session),
        RICOCHET_ERROR_CLOSED
    );
    let ev = client_event(client, ricochet_event_kind::RICOCHET_EVENT_DISCONNECTED);
    assert_eq!(
        (ev.reason, ev.by_peer),
        (ricochet::CloseReason::Application.to_u8(), 1)
    );
    // SAFETY: 1 readable byte.
    unsafe {
        assert_eq!(
            ricochet_client_send(client, 0, b"x".as_ptr(), 1),
            RICOCHET_ERROR_CLOSED
        );
    }
    let ev = server_event(
        server,
        ricochet_event_kind::RICOCHET_EVENT_DISCONNECTED,
        &mut buf,
    );
    assert_eq!(ev.session, session);
    // A session id that never existed.
    let made_up = ricochet_session {
        worker: 1,
        id: 12345,
    };
    // SAFETY: 1 readable byte.
    unsafe {
        assert_eq!(
            ricochet_server_send(server, made_up, 0, b"x".as_ptr(), 1),
            RICOCHET_ERROR_CLOSED
        );
    }
    assert_eq!(ricochet_client_destroy(client), RICOCHET_OK);
    assert_eq!(ricochet_server_stop(server), RICOCHET_OK);
}

#[test]
fn an_invalid_config_returns_invalid_config() {
    let mut cfg = std::mem::MaybeUninit::uninit();
    assert_eq!(
        // SAFETY: writable config.
        unsafe { ricochet_server_config_default(cfg.as_mut_ptr()) },
        RICOCHET_OK
    );
    // SAFETY: initialized above.
    let base = unsafe { cfg.assume_init() };
    let mut server = ricochet_server { id: 0 };
    let start = |c: ricochet_server_config, out: &mut ricochet_server| {
        // SAFETY: a config whose strings are static C strings or null.
        unsafe { ricochet_server_start(&c, out) }
    };
    // No bind address.
    assert_eq!(start(base, &mut server), RICOCHET_ERROR_INVALID_CONFIG);
    assert!(last_error().contains("bind"), "{}", last_error());
    // No admission.
    let mut c = base;
    c.bind = c"127.0.0.1:0".as_ptr();
    assert_eq!(start(c, &mut server), RICOCHET_ERROR_INVALID_CONFIG);
    assert!(last_error().contains("admission"), "{}", last_error());
    // An admission, a profile out of range.
    let mut c2 = c;
    c2.admission = 77;
    assert_eq!(start(c2, &mut server), RICOCHET_ERROR_INVALID_CONFIG);
    c2.admission = RICOCHET_ADMISSION_INSECURE;
    c2.profile = 9;
    assert_eq!(start(c2, &mut server), RICOCHET_ERROR_INVALID_CONFIG);
    // Tokens on a wildcard bind without a public address: the runtime's own check.
    let mut c3 = c;
    c3.bind = c"0.0.0.0:0".as_ptr();
    c3.admission = RICOCHET_ADMISSION_TOKENS;
    assert_eq!(start(c3, &mut server), RICOCHET_ERROR_INVALID_CONFIG);
    assert!(last_error().contains("public address"), "{}", last_error());
    // An address that does not parse.
    let mut c4 = c;
    c4.admission = RICOCHET_ADMISSION_INSECURE;
    c4.bind = c"not an address".as_ptr();
    assert_eq!(start(c4, &mut server), RICOCHET_ERROR_INVALID_ARGUMENT);
    assert_eq!(server.id, 0, "no handle on failure");
    // A client profile out of range.
    let mut cc = std::mem::MaybeUninit::uninit();
    assert_eq!(
        // SAFETY: writable config.
        unsafe { ricochet_client_config_default(cc.as_mut_ptr()) },
        RICOCHET_OK
    );
    // SAFETY: initialized above.
    let mut cc = unsafe { cc.assume_init() };
    cc.profile = 42;
    let mut client = ricochet_client { id: 0 };
    // SAFETY: valid pointers.
    let s = unsafe { ricochet_client_connect_insecure(c"127.0.0.1:9".as_ptr(), &cc, &mut client) };
    assert_eq!(s, RICOCHET_ERROR_INVALID_CONFIG);
    // A malformed token.
    let junk = [0u8; 785];
    // SAFETY: 785 readable bytes.
    let s = unsafe { ricochet_client_connect(junk.as_ptr(), junk.len(), null(), &mut client) };
    assert_eq!(s, RICOCHET_ERROR_TOKEN);
}

#[test]
fn a_panic_inside_the_library_returns_panic() {
    assert_eq!(ricochet_test_panic(), RICOCHET_ERROR_PANIC);
    assert!(
        last_error().contains("ricochet_test_panic"),
        "{}",
        last_error()
    );
    // The library still works afterwards.
    // SAFETY: static string.
    assert!(!unsafe { CStr::from_ptr(ricochet_version()) }.is_empty());
    assert_eq!(
        ricochet_client_update(ricochet_client { id: 0 }, 0),
        RICOCHET_ERROR_INVALID_HANDLE
    );
}

/// Connect an insecure client to `server` and return it with its session there.
fn connect(server: ricochet_server) -> (ricochet_client, ricochet_session) {
    let addr = local_address(server);
    let mut client = ricochet_client { id: 0 };
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { ricochet_client_connect_insecure(addr.as_ptr(), null(), &mut client) },
        RICOCHET_OK
    );
    client_event(client, ricochet_event_kind::RICOCHET_EVENT_CONNECTED);
    let mut buf = [0u8; 64];
    let ev = server_event(
        server,
        ricochet_event_kind::RICOCHET_EVENT_CONNECTED,
        &mut buf,
    );
    (client, ev.session)
}

#[test]
fn a_send_on_an_unknown_channel_or_too_large_is_refused_in_the_call() {
    let server = insecure_server(1);
    let (client, session) = connect(server);
    // SAFETY: 1 readable byte.
    let s = unsafe { ricochet_server_send(server, session, 200, b"x".as_ptr(), 1) };
    assert_eq!(s, RICOCHET_ERROR_UNKNOWN_CHANNEL);
    assert!(last_error().contains("200"), "{}", last_error());
    let big = vec![0u8; (1 << 20) + 1];
    // SAFETY: big.len() readable bytes.
    let s = unsafe { ricochet_server_send(server, session, 0, big.as_ptr(), big.len()) };
    assert_eq!(s, RICOCHET_ERROR_MESSAGE_TOO_LARGE);
    assert!(!last_error().is_empty());
    // The largest message is still accepted.
    // SAFETY: 1 MiB readable bytes.
    let s = unsafe { ricochet_server_send(server, session, 0, big.as_ptr(), 1 << 20) };
    assert_eq!(s, RICOCHET_OK);
    let mut drops = u64::MAX;
    // SAFETY: one writable u64.
    let s = unsafe { ricochet_server_send_drops(server, &mut drops) };
    assert_eq!((s, drops), (RICOCHET_OK, 0));
    // SAFETY: null is refused, never written.
    let s = unsafe { ricochet_server_send_drops(server, null_mut()) };
    assert_eq!(s, RICOCHET_ERROR_NULL_POINTER);
    assert_eq!(ricochet_client_destroy(client), RICOCHET_OK);
    assert_eq!(ricochet_server_stop(server), RICOCHET_OK);
}

#[test]
fn local_address_too_small_says_why_in_the_last_error() {
    let server = insecure_server(1);
    let mut buf = [0 as c_char; 4];
    let mut len = 0usize;
    // SAFETY: a buffer of 4 bytes and a length slot.
    let s = unsafe { ricochet_server_local_address(server, buf.as_mut_ptr(), 4, &mut len) };
    assert_eq!(s, RICOCHET_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(len, local_address(server).as_bytes().len() + 1);
    // SAFETY: a buffer of 4 bytes.
    let s = unsafe { ricochet_server_local_address(server, buf.as_mut_ptr(), 4, &mut len) };
    assert_eq!(s, RICOCHET_ERROR_BUFFER_TOO_SMALL);
    assert!(last_error().contains("too small"), "{}", last_error());
    assert_eq!(ricochet_server_stop(server), RICOCHET_OK);
}

#[test]
fn a_small_byte_cap_on_the_event_queue_still_delivers_every_message() {
    const MESSAGES: usize = 40;
    // Room for two of the 1,000-byte messages: the worker waits for the host to drain.
    let server = insecure_server_with(1, |c| c.event_queue_bytes = 2_500);
    let (client, session) = connect(server);
    for i in 0..MESSAGES {
        let msg = vec![i as u8; 1_000];
        // SAFETY: msg.len() readable bytes.
        let s = unsafe { ricochet_client_send(client, 0, msg.as_ptr(), msg.len()) };
        assert_eq!(s, RICOCHET_OK);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = 0;
    let mut buf = [0u8; 2048];
    while got < MESSAGES {
        assert!(Instant::now() < deadline, "only {got} messages arrived");
        assert_eq!(ricochet_client_update(client, 1), RICOCHET_OK);
        loop {
            let mut ev = empty_server_event();
            // SAFETY: event slot and buffer of buf.len() bytes.
            let s =
                unsafe { ricochet_server_poll(server, 0, &mut ev, buf.as_mut_ptr(), buf.len()) };
            assert_eq!(s, RICOCHET_OK);
            match ev.kind {
                ricochet_event_kind::RICOCHET_EVENT_NONE => break,
                ricochet_event_kind::RICOCHET_EVENT_MESSAGE => {
                    assert_eq!(ev.session, session);
                    assert_eq!(ev.len, 1_000);
                    // Reliable ordered: in order, none lost.
                    assert!(buf[..1_000].iter().all(|&b| b == got as u8));
                    got += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(ricochet_client_destroy(client), RICOCHET_OK);
    assert_eq!(ricochet_server_stop(server), RICOCHET_OK);
}
