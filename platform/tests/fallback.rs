//! Backend selection through the environment: forcing io_uring to fail selects `mmsg` and says
//! why; `RICOCHET_BACKEND` forces a backend. One test in its own binary (its own process), so
//! setting environment variables cannot disturb other tests.

#[cfg(target_os = "linux")]
#[test]
fn forced_uring_failure_falls_back_to_mmsg_and_says_why() {
    use ricochet_platform::{
        bind, open, BackendConfig, BackendKind, Error, SocketConfig, BACKEND_ENV,
    };
    let sock = || bind(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let auto = BackendConfig::default();

    std::env::remove_var(BACKEND_ENV);
    std::env::set_var("RICOCHET_URING_FAIL", "enomem");
    let b = open(sock(), &auto).unwrap();
    assert_eq!(b.kind(), BackendKind::Mmsg);
    let why = b.selection_reason();
    assert!(why.contains("falling back to epoll+mmsg"), "{why}");
    assert!(why.contains("ulimit -l"), "the fix is named: {why}");
    // Asking for uring explicitly is an error, not a silent fallback.
    let uring = BackendConfig {
        kind: BackendKind::Uring,
        ..BackendConfig::default()
    };
    assert!(open(sock(), &uring).is_err());

    std::env::set_var("RICOCHET_URING_FAIL", "eperm");
    let b = open(sock(), &auto).unwrap();
    assert_eq!(b.kind(), BackendKind::Mmsg);
    assert!(
        b.selection_reason().contains("io_uring_disabled"),
        "{}",
        b.selection_reason()
    );

    std::env::set_var("RICOCHET_URING_FAIL", "bogus");
    assert!(matches!(open(sock(), &auto), Err(Error::InvalidConfig(_))));
    std::env::remove_var("RICOCHET_URING_FAIL");

    // Without the failure, auto picks uring where the probe says it works.
    let b = open(sock(), &auto).unwrap();
    let expected = if ricochet_platform::probe().uring_usable() {
        BackendKind::Uring
    } else {
        BackendKind::Mmsg
    };
    assert_eq!(b.kind(), expected, "{}", b.selection_reason());

    std::env::set_var(BACKEND_ENV, "mmsg");
    let b = open(sock(), &auto).unwrap();
    assert_eq!(b.kind(), BackendKind::Mmsg);
    assert!(
        b.selection_reason().contains("RICOCHET_BACKEND=mmsg"),
        "{}",
        b.selection_reason()
    );
    std::env::set_var(BACKEND_ENV, "kqueue");
    assert!(matches!(
        open(sock(), &auto),
        Err(Error::BackendUnavailable { .. })
    ));
    std::env::set_var(BACKEND_ENV, "nonsense");
    assert!(matches!(open(sock(), &auto), Err(Error::InvalidConfig(_))));
    std::env::remove_var(BACKEND_ENV);
}
