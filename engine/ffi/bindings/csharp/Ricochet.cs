// The idiomatic C# layer: IDisposable client, server and token issuer; messages as
// ReadOnlySpan<byte>; failures as RicochetException with the library's text. Poll-style: no
// callbacks, so it works the same under Mono and IL2CPP (see docs/unity.md).
using System;
using System.Runtime.InteropServices;
using System.Text;
using Ricochet.Native;

namespace Ricochet
{
    /// <summary>A failed call: its status and the library's message.</summary>
    public sealed class RicochetException : Exception
    {
        public Status Status { get; private set; }

        public RicochetException(Status status, string message) : base(message)
        {
            Status = status;
        }

        internal static unsafe void Check(Status s)
        {
            if (s == Status.Ok)
            {
                return;
            }
            throw new RicochetException(s, Describe(s));
        }

        internal static unsafe string Describe(Status s)
        {
            string text = Marshal.PtrToStringAnsi(Lib.ricochet_error_text((int)s));
            byte* buf = stackalloc byte[512];
            UIntPtr len;
            if (Lib.ricochet_last_error(buf, (UIntPtr)512, &len) == Status.Ok && len.ToUInt64() > 0)
            {
                text += ": " + Encoding.UTF8.GetString(buf, (int)len.ToUInt64());
            }
            return text;
        }
    }

    /// <summary>What a session is tuned for; use the server's.</summary>
    public enum Profile : uint
    {
        Default = 0,
        Game = 1,
        Bulk = 2,
    }

    /// <summary>The library's version and texts.</summary>
    public static class Library
    {
        public static string Version
        {
            get { return Marshal.PtrToStringAnsi(Lib.ricochet_version()); }
        }

        /// <summary>What a disconnected event's reason code means.</summary>
        public static string CloseReasonText(byte reason)
        {
            return Marshal.PtrToStringAnsi(Lib.ricochet_close_reason_text(reason));
        }
    }

    /// <summary>NUL-terminated UTF-8 copies of strings, freed on Dispose.</summary>
    internal sealed class Utf8Strings : IDisposable
    {
        public readonly IntPtr[] Pointers;

        public Utf8Strings(string[] values)
        {
            Pointers = new IntPtr[values.Length];
            for (int i = 0; i < values.Length; i++)
            {
                byte[] b = Encoding.UTF8.GetBytes(values[i]);
                IntPtr p = Marshal.AllocHGlobal(b.Length + 1);
                Marshal.Copy(b, 0, p, b.Length);
                Marshal.WriteByte(p, b.Length, 0);
                Pointers[i] = p;
            }
        }

        public void Dispose()
        {
            for (int i = 0; i < Pointers.Length; i++)
            {
                if (Pointers[i] != IntPtr.Zero)
                {
                    Marshal.FreeHGlobal(Pointers[i]);
                    Pointers[i] = IntPtr.Zero;
                }
            }
        }
    }

    /// <summary>An event. <see cref="Message"/> is valid until the next Poll on its owner.</summary>
    public struct Event
    {
        public EventKind Kind;
        public byte Channel;
        /// <summary>Disconnected: why (see <see cref="Library.CloseReasonText"/>).</summary>
        public byte Reason;
        public bool ByPeer;
        /// <summary>Server events: the session.</summary>
        public Session Session;
        /// <summary>Server connected events: the token's client id, if any.</summary>
        public ulong? ClientId;
        internal byte[] Buffer;
        internal int Length;

        /// <summary>A message event's bytes (a view of the owner's buffer, valid until its next Poll).</summary>
        public ReadOnlySpan<byte> Message
        {
            get { return new ReadOnlySpan<byte>(Buffer, 0, Length); }
        }
    }

    /// <summary>A connection to a server; drive it with Update and Poll every frame.</summary>
    public sealed unsafe class RicochetClient : IDisposable
    {
        private ClientHandle handle;
        private byte[] buffer = new byte[2048];

        private RicochetClient(ClientHandle h)
        {
            handle = h;
        }

        /// <summary>Start connecting with a token the backend issued; Connected or Disconnected reports the outcome.</summary>
        public static RicochetClient Connect(ReadOnlySpan<byte> token, Profile profile = Profile.Default)
        {
            ClientConfig config;
            RicochetException.Check(Lib.ricochet_client_config_default(&config));
            config.Profile = (uint)profile;
            ClientHandle h;
            fixed (byte* t = token)
            {
                RicochetException.Check(Lib.ricochet_client_connect(t, (UIntPtr)token.Length, &config, &h));
            }
            return new RicochetClient(h);
        }

        /// <summary>Start connecting to an insecure server at "ip:port" (LAN play, local tests).</summary>
        public static RicochetClient ConnectInsecure(string address, Profile profile = Profile.Default)
        {
            ClientConfig config;
            RicochetException.Check(Lib.ricochet_client_config_default(&config));
            config.Profile = (uint)profile;
            ClientHandle h;
            using (var s = new Utf8Strings(new[] { address }))
            {
                RicochetException.Check(Lib.ricochet_client_connect_insecure(s.Pointers[0], &config, &h));
            }
            return new RicochetClient(h);
        }

        /// <summary>Queue a message on a channel (copied during the call).</summary>
        public void Send(byte channel, ReadOnlySpan<byte> message)
        {
            RicochetException.Check(TrySendStatus(channel, message));
        }

        /// <summary>Like Send, but false instead of an exception when the send queue is full.</summary>
        public bool TrySend(byte channel, ReadOnlySpan<byte> message)
        {
            Status s = TrySendStatus(channel, message);
            if (s == Status.QueueFull)
            {
                return false;
            }
            RicochetException.Check(s);
            return true;
        }

        private Status TrySendStatus(byte channel, ReadOnlySpan<byte> message)
        {
            fixed (byte* p = message)
            {
                return Lib.ricochet_client_send(handle, channel, p, (UIntPtr)message.Length);
            }
        }

        /// <summary>Send, receive and run timers; wait up to timeoutMs (0: not at all).</summary>
        public void Update(uint timeoutMs = 0)
        {
            RicochetException.Check(Lib.ricochet_client_update(handle, timeoutMs));
        }

        /// <summary>Take the next event; false when none is waiting.</summary>
        public bool Poll(out Event e)
        {
            ClientEvent ev;
            Status s;
            fixed (byte* b = buffer)
            {
                s = Lib.ricochet_client_poll(handle, &ev, b, (UIntPtr)buffer.Length);
            }
            if (s == Status.BufferTooSmall)
            {
                buffer = new byte[(int)ev.Len.ToUInt64()];
                fixed (byte* b = buffer)
                {
                    s = Lib.ricochet_client_poll(handle, &ev, b, (UIntPtr)buffer.Length);
                }
            }
            RicochetException.Check(s);
            e = new Event
            {
                Kind = ev.Kind,
                Channel = ev.Channel,
                Reason = ev.Reason,
                ByPeer = ev.ByPeer != 0,
                Buffer = buffer,
                Length = ev.Kind == EventKind.Message ? (int)ev.Len.ToUInt64() : 0,
            };
            return ev.Kind != EventKind.None;
        }

        /// <summary>The session's counters.</summary>
        public Stats Stats
        {
            get
            {
                Stats s;
                RicochetException.Check(Lib.ricochet_client_stats(handle, &s));
                return s;
            }
        }

        /// <summary>Close gracefully; keep updating until Disconnected, then Dispose.</summary>
        public void Close()
        {
            RicochetException.Check(Lib.ricochet_client_close(handle));
        }

        /// <summary>Destroy the client (its socket closes at once).</summary>
        public void Dispose()
        {
            if (handle.Id != 0)
            {
                Lib.ricochet_client_destroy(handle);
                handle.Id = 0;
            }
            GC.SuppressFinalize(this);
        }

        ~RicochetClient()
        {
            if (handle.Id != 0)
            {
                Lib.ricochet_client_destroy(handle);
            }
        }
    }

    /// <summary>Server settings.</summary>
    public sealed class ServerOptions
    {
        public string Bind = "0.0.0.0:0";
        public string PublicAddress;
        /// <summary>The backend's key: token admission. Null with Insecure = true for LAN play.</summary>
        public byte[] TokenKey;
        public ulong ProtocolId;
        public bool Insecure;
        public Profile Profile = Profile.Default;
        public uint Workers;
        public uint MaxSessions;
        public uint MaxSessionsPerAddress;
        public uint EventQueueCapacity;
        /// <summary>Message bytes each worker's queue holds; 0: the default (64 MiB).</summary>
        public ulong EventQueueBytes;
    }

    /// <summary>A running server; drain its events with Poll every frame. Dispose stops it.</summary>
    public sealed unsafe class RicochetServer : IDisposable
    {
        private ServerHandle handle;
        private byte[] buffer = new byte[2048];

        private RicochetServer(ServerHandle h)
        {
            handle = h;
        }

        public static RicochetServer Start(ServerOptions o)
        {
            ServerConfig c;
            RicochetException.Check(Lib.ricochet_server_config_default(&c));
            c.Admission = o.Insecure ? Lib.AdmissionInsecure : (o.TokenKey != null ? Lib.AdmissionTokens : 0);
            if (o.TokenKey != null)
            {
                if (o.TokenKey.Length != 32)
                {
                    throw new ArgumentException("a token key is 32 bytes");
                }
                for (int i = 0; i < 32; i++)
                {
                    c.TokenKey[i] = o.TokenKey[i];
                }
            }
            c.ProtocolId = o.ProtocolId;
            c.Profile = (uint)o.Profile;
            c.Workers = o.Workers;
            c.MaxSessions = o.MaxSessions;
            c.MaxSessionsPerAddress = o.MaxSessionsPerAddress;
            c.EventQueueCapacity = o.EventQueueCapacity;
            c.EventQueueBytes = o.EventQueueBytes;
            ServerHandle h;
            using (var s = new Utf8Strings(new[] { o.Bind ?? "", o.PublicAddress ?? "" }))
            {
                c.Bind = o.Bind != null ? s.Pointers[0] : IntPtr.Zero;
                c.PublicAddress = o.PublicAddress != null ? s.Pointers[1] : IntPtr.Zero;
                RicochetException.Check(Lib.ricochet_server_start(&c, &h));
            }
            return new RicochetServer(h);
        }

        /// <summary>The bound address, "ip:port".</summary>
        public string LocalAddress
        {
            get
            {
                byte* buf = stackalloc byte[128];
                UIntPtr len;
                RicochetException.Check(Lib.ricochet_server_local_address(handle, buf, (UIntPtr)128, &len));
                return Encoding.UTF8.GetString(buf, (int)len.ToUInt64());
            }
        }

        /// <summary>Take the next event of any worker; false when none is waiting.</summary>
        public bool Poll(out Event e)
        {
            ServerEvent ev;
            Status s;
            fixed (byte* b = buffer)
            {
                s = Lib.ricochet_server_poll(handle, Lib.AnyWorker, &ev, b, (UIntPtr)buffer.Length);
            }
            if (s == Status.BufferTooSmall)
            {
                buffer = new byte[(int)ev.Len.ToUInt64()];
                fixed (byte* b = buffer)
                {
                    s = Lib.ricochet_server_poll(handle, Lib.AnyWorker, &ev, b, (UIntPtr)buffer.Length);
                }
            }
            RicochetException.Check(s);
            e = new Event
            {
                Kind = ev.Kind,
                Channel = ev.Channel,
                Reason = ev.Reason,
                ByPeer = ev.ByPeer != 0,
                Session = ev.Session,
                ClientId = ev.HasClientId != 0 ? (ulong?)ev.ClientId : null,
                Buffer = buffer,
                Length = ev.Kind == EventKind.Message ? (int)ev.Len.ToUInt64() : 0,
            };
            return ev.Kind != EventKind.None;
        }

        /// <summary>Queue a message to a session (copied during the call).</summary>
        public void Send(Session session, byte channel, ReadOnlySpan<byte> message)
        {
            fixed (byte* p = message)
            {
                RicochetException.Check(Lib.ricochet_server_send(handle, session, channel, p, (UIntPtr)message.Length));
            }
        }

        /// <summary>Close a session gracefully.</summary>
        public void CloseSession(Session session)
        {
            RicochetException.Check(Lib.ricochet_server_close_session(handle, session));
        }

        /// <summary>Stop the server (closes every session; blocks until the workers end).</summary>
        public void Dispose()
        {
            if (handle.Id != 0)
            {
                ServerHandle h = handle;
                handle.Id = 0;
                RicochetException.Check(Lib.ricochet_server_stop(h));
            }
            GC.SuppressFinalize(this);
        }

        ~RicochetServer()
        {
            if (handle.Id != 0)
            {
                Lib.ricochet_server_stop(handle);
            }
        }
    }

    /// <summary>Issues connect tokens (what a game backend does; docs/tokens.md).</summary>
    public sealed unsafe class TokenIssuer : IDisposable
    {
        private IssuerHandle handle;

        /// <summary>An issuer for the backend's 32-byte key and the game's protocol id.</summary>
        public TokenIssuer(byte[] key, ulong protocolId, uint validForSeconds = 30)
        {
            if (key == null || key.Length != 32)
            {
                throw new ArgumentException("a token key is 32 bytes");
            }
            IssuerHandle h;
            fixed (byte* k = key)
            {
                RicochetException.Check(Lib.ricochet_token_issuer_new(k, protocolId, validForSeconds, &h));
            }
            handle = h;
        }

        /// <summary>A token for player clientId onto the servers ("ip:port", tried in order).</summary>
        public byte[] Issue(ulong clientId, string[] servers, ReadOnlySpan<byte> userData = default(ReadOnlySpan<byte>))
        {
            var token = new byte[Lib.ConnectTokenLength];
            UIntPtr len;
            using (var s = new Utf8Strings(servers))
            {
                fixed (IntPtr* a = s.Pointers)
                fixed (byte* d = userData)
                fixed (byte* t = token)
                {
                    RicochetException.Check(Lib.ricochet_token_issue(handle, clientId, a, (UIntPtr)servers.Length, d, (UIntPtr)userData.Length, t, (UIntPtr)token.Length, &len));
                }
            }
            return token;
        }

        public void Dispose()
        {
            if (handle.Id != 0)
            {
                Lib.ricochet_token_issuer_destroy(handle);
                handle.Id = 0;
            }
            GC.SuppressFinalize(this);
        }

        ~TokenIssuer()
        {
            if (handle.Id != 0)
            {
                Lib.ricochet_token_issuer_destroy(handle);
            }
        }
    }

    /// <summary>Token encoding from every field (test vectors; backends with their own randomness).</summary>
    public static unsafe class Tokens
    {
        /// <summary>The token for these fields, session keys and nonce (docs/tokens.md).</summary>
        public static byte[] Encode(byte[] key, ulong protocolId, ulong clientId, ulong expiresUnix, string[] servers, byte[] userData, byte[] clientToServerKey, byte[] serverToClientKey, byte[] nonce)
        {
            if (key.Length != 32 || clientToServerKey.Length != 32 || serverToClientKey.Length != 32 || nonce.Length != 24)
            {
                throw new ArgumentException("keys are 32 bytes and the nonce 24");
            }
            var token = new byte[Lib.ConnectTokenLength];
            UIntPtr len;
            using (var s = new Utf8Strings(servers))
            {
                fixed (IntPtr* a = s.Pointers)
                fixed (byte* k = key, d = userData, c2s = clientToServerKey, s2c = serverToClientKey, n = nonce, t = token)
                {
                    RicochetException.Check(Lib.ricochet_token_encode(k, protocolId, clientId, expiresUnix, a, (UIntPtr)servers.Length, d, (UIntPtr)(userData == null ? 0 : userData.Length), c2s, s2c, n, t, (UIntPtr)token.Length, &len));
                }
            }
            return token;
        }
    }
}
