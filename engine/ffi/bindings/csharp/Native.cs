// P/Invoke layer over ricochet.h, written by hand to match it field for field (the Rust test
// `csharp` builds and runs it against the library). Unity: see docs/unity.md.
using System;
using System.Runtime.InteropServices;

namespace Ricochet.Native
{
    /// <summary>ricochet_status: 0 is success.</summary>
    public enum Status : int
    {
        Ok = 0,
        NullPointer = 1,
        InvalidHandle = 2,
        BufferTooSmall = 3,
        Closed = 4,
        InvalidConfig = 5,
        InvalidArgument = 6,
        UnknownChannel = 7,
        MessageTooLarge = 8,
        QueueFull = 9,
        Token = 10,
        Io = 11,
        Panic = 12,
    }

    /// <summary>ricochet_event_kind.</summary>
    public enum EventKind : int
    {
        None = 0,
        Connected = 1,
        Message = 2,
        Disconnected = 3,
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct ClientHandle { public ulong Id; }

    [StructLayout(LayoutKind.Sequential)]
    public struct ServerHandle { public ulong Id; }

    [StructLayout(LayoutKind.Sequential)]
    public struct IssuerHandle { public ulong Id; }

    /// <summary>ricochet_session: the owning worker and the session's id there.</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct Session : IEquatable<Session>
    {
        public uint Worker;
        public ulong Id;
        public bool Equals(Session o) { return Worker == o.Worker && Id == o.Id; }
        public override bool Equals(object o) { return o is Session && Equals((Session)o); }
        public override int GetHashCode() { return Id.GetHashCode() ^ (int)Worker; }
        public override string ToString() { return Worker + "/" + Id.ToString("x16"); }
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct ClientConfig
    {
        public uint Profile;
        public ulong Seed;
        /// <summary>ricochet_lane*: null and 0 for one lane of every channel.</summary>
        public IntPtr Lanes;
        public UIntPtr LaneCount;
    }

    [StructLayout(LayoutKind.Sequential)]
    public unsafe struct ServerConfig
    {
        public IntPtr Bind;
        public IntPtr PublicAddress;
        public uint Admission;
        public fixed byte TokenKey[32];
        public ulong ProtocolId;
        public uint Profile;
        public uint Workers;
        public uint MaxSessions;
        public uint MaxSessionsPerAddress;
        public uint EventQueueCapacity;
        public ulong EventQueueBytes;
        /// <summary>ricochet_lane*: null and 0 for one lane of every channel.</summary>
        public IntPtr Lanes;
        public UIntPtr LaneCount;
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct ClientEvent
    {
        public EventKind Kind;
        public byte Channel;
        public byte ByPeer;
        public byte Reason;
        public UIntPtr Len;
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct ServerEvent
    {
        public EventKind Kind;
        public Session Session;
        public byte Channel;
        public byte ByPeer;
        public byte Reason;
        public byte HasClientId;
        public ulong ClientId;
        public UIntPtr Len;
    }

    /// <summary>ricochet_stats.</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct Stats
    {
        public ulong RttMicros;
        public ulong MinRttMicros;
        public ulong RtoMicros;
        public ulong PacketsSent;
        public ulong PacketsReceived;
        public ulong BytesSent;
        public ulong BytesReceived;
        public ulong PacketsLost;
        public ulong Retransmitted;
        public ulong MessagesDelivered;
        public ulong FecRecovered;
        public ulong CongestionWindow;
        public ulong BytesInFlight;
    }

    public static unsafe class Lib
    {
#if UNITY_IOS && !UNITY_EDITOR
        // iOS links the static library into the app: its symbols are the process's own.
        public const string Name = "__Internal";
#else
        public const string Name = "ricochet_ffi";
#endif
        public const uint AdmissionTokens = 1;
        public const uint AdmissionInsecure = 2;
        public const uint AnyWorker = 0xFFFFFFFF;
        public const int ConnectTokenLength = 785;

        [DllImport(Name)] public static extern IntPtr ricochet_version();
        [DllImport(Name)] public static extern IntPtr ricochet_error_text(int code);
        [DllImport(Name)] public static extern IntPtr ricochet_close_reason_text(byte reason);
        [DllImport(Name)] public static extern Status ricochet_last_error(byte* buf, UIntPtr cap, UIntPtr* len);

        [DllImport(Name)] public static extern Status ricochet_token_issuer_new(byte* key, ulong protocolId, ulong validForSecs, IssuerHandle* outIssuer);
        [DllImport(Name)] public static extern Status ricochet_token_issuer_destroy(IssuerHandle issuer);
        [DllImport(Name)] public static extern Status ricochet_token_issue(IssuerHandle issuer, ulong clientId, IntPtr* addresses, UIntPtr addressCount, byte* userData, UIntPtr userDataLen, byte* outBuf, UIntPtr cap, UIntPtr* outLen);
        [DllImport(Name)] public static extern Status ricochet_token_encode(byte* key, ulong protocolId, ulong clientId, ulong expiresUnix, IntPtr* addresses, UIntPtr addressCount, byte* userData, UIntPtr userDataLen, byte* clientToServerKey, byte* serverToClientKey, byte* nonce, byte* outBuf, UIntPtr cap, UIntPtr* outLen);

        [DllImport(Name)] public static extern Status ricochet_client_config_default(ClientConfig* outConfig);
        [DllImport(Name)] public static extern Status ricochet_client_connect(byte* token, UIntPtr tokenLen, ClientConfig* config, ClientHandle* outClient);
        [DllImport(Name)] public static extern Status ricochet_client_connect_insecure(IntPtr address, ClientConfig* config, ClientHandle* outClient);
        [DllImport(Name)] public static extern Status ricochet_client_send(ClientHandle client, byte channel, byte* data, UIntPtr len);
        [DllImport(Name)] public static extern Status ricochet_client_update(ClientHandle client, uint timeoutMs);
        [DllImport(Name)] public static extern Status ricochet_client_poll(ClientHandle client, ClientEvent* ev, byte* buf, UIntPtr cap);
        [DllImport(Name)] public static extern Status ricochet_client_stats(ClientHandle client, Stats* stats);
        [DllImport(Name)] public static extern Status ricochet_client_close(ClientHandle client);
        [DllImport(Name)] public static extern Status ricochet_client_destroy(ClientHandle client);

        [DllImport(Name)] public static extern Status ricochet_server_config_default(ServerConfig* outConfig);
        [DllImport(Name)] public static extern Status ricochet_server_start(ServerConfig* config, ServerHandle* outServer);
        [DllImport(Name)] public static extern Status ricochet_server_send_drops(ServerHandle server, ulong* drops);
        [DllImport(Name)] public static extern Status ricochet_server_local_address(ServerHandle server, byte* buf, UIntPtr cap, UIntPtr* len);
        [DllImport(Name)] public static extern Status ricochet_server_workers(ServerHandle server, uint* workers);
        [DllImport(Name)] public static extern Status ricochet_server_poll(ServerHandle server, uint worker, ServerEvent* ev, byte* buf, UIntPtr cap);
        [DllImport(Name)] public static extern Status ricochet_server_send(ServerHandle server, Session session, byte channel, byte* data, UIntPtr len);
        [DllImport(Name)] public static extern Status ricochet_server_close_session(ServerHandle server, Session session);
        [DllImport(Name)] public static extern Status ricochet_server_stop(ServerHandle server);
    }
}
