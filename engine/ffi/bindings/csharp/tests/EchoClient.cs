// The C# binding's test and benchmark program (run under Mono by the Rust test `csharp` and
// by `bench ffi`):
//
//   EchoClient.exe echo ADDRESS (--token HEX | --key HEX --protocol-id N | --insecure)
//                  [--clients N] [--window W] [--size S] [--messages M | --seconds T]
//   EchoClient.exe vectors    (token test vectors on stdin, one a line; see tests/tokens.rs)
//   EchoClient.exe errors     (failures come back as RicochetException with the library's text)
using System;
using System.Diagnostics;
using System.Globalization;
using System.Threading;
using Ricochet;
using Ricochet.Native;

static class EchoClient
{
    static byte[] Hex(string s)
    {
        if (s == "-")
        {
            return new byte[0];
        }
        var b = new byte[s.Length / 2];
        for (int i = 0; i < b.Length; i++)
        {
            b[i] = byte.Parse(s.Substring(2 * i, 2), NumberStyles.HexNumber);
        }
        return b;
    }

    // The echo messages' pattern, the same as examples/c/common.h's.
    static void Fill(byte[] buf, ulong seq, uint client)
    {
        for (int i = 0; i < buf.Length; i++)
        {
            buf[i] = (byte)(seq * 31UL + (ulong)i * 7UL + client);
        }
        if (buf.Length >= 12)
        {
            BitConverter.GetBytes(seq).CopyTo(buf, 0);
            BitConverter.GetBytes(client).CopyTo(buf, 8);
        }
    }

    class Options
    {
        public string Address;
        public bool Insecure;
        public byte[] Token;
        public byte[] Key;
        public ulong ProtocolId;
        public int Clients = 1;
        public ulong Window = 16;
        public int Size = 1024;
        public ulong Messages = 10000;
        public double Seconds;
        public TokenIssuer Issuer;
    }

    static bool RunClient(Options o, uint index, out ulong roundTrips)
    {
        roundTrips = 0;
        RicochetClient client;
        if (o.Insecure)
        {
            client = RicochetClient.ConnectInsecure(o.Address);
        }
        else if (o.Token != null)
        {
            client = RicochetClient.Connect(o.Token);
        }
        else
        {
            client = RicochetClient.Connect(o.Issuer.Issue(1000 + index, new[] { o.Address }));
        }
        using (client)
        {
            var output = new byte[o.Size];
            var expect = new byte[o.Size];
            ulong sent = 0, received = 0, atStop = 0;
            bool connected = false, ok = true, stopped = false;
            var clock = Stopwatch.StartNew();
            double limit = o.Seconds > 0 ? o.Seconds + 30 : 120;
            while (true)
            {
                double now = clock.Elapsed.TotalSeconds;
                if (now > limit)
                {
                    Console.Error.WriteLine("client {0}: timed out ({1} of {2} echoed)", index, received, sent);
                    ok = false;
                    break;
                }
                bool more = o.Seconds > 0 ? now < o.Seconds : sent < o.Messages;
                if (o.Seconds > 0 && !more && !stopped)
                {
                    // The echoes back before sending stopped, over exactly --seconds.
                    stopped = true;
                    atStop = received;
                }
                if (connected)
                {
                    while (more && (o.Seconds > 0 || sent < o.Messages) && sent - received < o.Window)
                    {
                        Fill(output, sent, index);
                        if (!client.TrySend(0, output))
                        {
                            break;
                        }
                        sent++;
                    }
                    if (!more && received == sent)
                    {
                        break;
                    }
                }
                client.Update(1);
                Event e;
                while (client.Poll(out e))
                {
                    if (e.Kind == EventKind.Connected)
                    {
                        connected = true;
                    }
                    else if (e.Kind == EventKind.Disconnected)
                    {
                        Console.Error.WriteLine("client {0}: disconnected: {1}", index, Library.CloseReasonText(e.Reason));
                        roundTrips = received;
                        return false;
                    }
                    else if (e.Kind == EventKind.Message)
                    {
                        Fill(expect, received, index);
                        if (e.Channel != 0 || !e.Message.SequenceEqual(expect))
                        {
                            Console.Error.WriteLine("client {0}: echo {1} differs from what was sent", index, received);
                            roundTrips = received;
                            return false;
                        }
                        received++;
                    }
                }
            }
            roundTrips = o.Seconds > 0 ? atStop : received;
            client.Close();
            var closing = Stopwatch.StartNew();
            while (closing.Elapsed.TotalSeconds < 3)
            {
                client.Update(5);
                Event e;
                if (client.Poll(out e) && e.Kind == EventKind.Disconnected)
                {
                    break;
                }
            }
            return ok;
        }
    }

    static int Echo(string[] args)
    {
        var o = new Options { Address = args[1] };
        for (int i = 2; i < args.Length; i++)
        {
            string a = args[i];
            if (a == "--insecure")
            {
                o.Insecure = true;
                continue;
            }
            string v = args[++i];
            switch (a)
            {
                case "--token": o.Token = Hex(v); break;
                case "--key": o.Key = Hex(v); break;
                case "--protocol-id": o.ProtocolId = ulong.Parse(v); break;
                case "--clients": o.Clients = int.Parse(v); break;
                case "--window": o.Window = ulong.Parse(v); break;
                case "--size": o.Size = int.Parse(v); break;
                case "--messages": o.Messages = ulong.Parse(v); break;
                case "--seconds": o.Seconds = double.Parse(v, CultureInfo.InvariantCulture); break;
                default: Console.Error.WriteLine("unknown option " + a); return 2;
            }
        }
        if (o.Key != null)
        {
            o.Issuer = new TokenIssuer(o.Key, o.ProtocolId);
        }
        var threads = new Thread[o.Clients];
        var results = new ulong[o.Clients];
        var oks = new bool[o.Clients];
        var clock = Stopwatch.StartNew();
        for (int i = 0; i < o.Clients; i++)
        {
            uint index = (uint)i;
            threads[i] = new Thread(() =>
            {
                try
                {
                    oks[index] = RunClient(o, index, out results[index]);
                }
                catch (RicochetException e)
                {
                    Console.Error.WriteLine("client {0}: {1} ({2})", index, e.Message, e.Status);
                }
            });
            threads[i].Start();
        }
        ulong total = 0;
        bool allOk = true;
        for (int i = 0; i < o.Clients; i++)
        {
            threads[i].Join();
            total += results[i];
            allOk &= oks[i];
        }
        double elapsed = o.Seconds > 0 ? o.Seconds : clock.Elapsed.TotalSeconds;
        if (o.Issuer != null)
        {
            o.Issuer.Dispose();
        }
        Console.WriteLine("{{\"client\":\"csharp\",\"clients\":{0},\"round_trips\":{1},\"seconds\":{2},\"ok\":{3}}}",
            o.Clients, total, elapsed.ToString("F3", CultureInfo.InvariantCulture), allOk ? "true" : "false");
        return allOk ? 0 : 1;
    }

    static int Vectors()
    {
        int passed = 0, failed = 0;
        string line;
        while ((line = Console.In.ReadLine()) != null)
        {
            string[] f = line.Split(' ');
            if (f.Length != 10)
            {
                failed++;
                continue;
            }
            byte[] token = Tokens.Encode(Hex(f[0]), ulong.Parse(f[1]), ulong.Parse(f[2]), ulong.Parse(f[3]),
                f[4].Split(','), Hex(f[5]), Hex(f[6]), Hex(f[7]), Hex(f[8]));
            if (new ReadOnlySpan<byte>(token).SequenceEqual(Hex(f[9])))
            {
                passed++;
            }
            else
            {
                Console.Error.WriteLine("vector {0}: the encoded token differs", passed + failed);
                failed++;
            }
        }
        Console.WriteLine("{0} passed, {1} failed", passed, failed);
        return failed == 0 && passed > 0 ? 0 : 1;
    }

    static int Errors()
    {
        int checks = 0;
        try
        {
            RicochetClient.Connect(new byte[10]);
        }
        catch (RicochetException e)
        {
            if (e.Status == Status.Token && e.Message.Contains("token"))
            {
                checks++;
            }
            Console.WriteLine("malformed token: " + e.Message);
        }
        try
        {
            RicochetServer.Start(new ServerOptions { Bind = "127.0.0.1:0" });
        }
        catch (RicochetException e)
        {
            if (e.Status == Status.InvalidConfig && e.Message.Contains("admission"))
            {
                checks++;
            }
            Console.WriteLine("no admission: " + e.Message);
        }
        var client = RicochetClient.ConnectInsecure("127.0.0.1:9");
        client.Dispose();
        try
        {
            // The handle is stale once disposed: the library says so, nothing crashes.
            Lib.ricochet_client_update(new ClientHandle { Id = 1 }, 0);
            client.Update();
        }
        catch (RicochetException e)
        {
            if (e.Status == Status.InvalidHandle)
            {
                checks++;
            }
            Console.WriteLine("disposed client: " + e.Message);
        }
        Console.WriteLine("version " + Library.Version + ", " + checks + " of 3 error checks passed");
        return checks == 3 ? 0 : 1;
    }

    static int Main(string[] args)
    {
        if (args.Length >= 2 && args[0] == "echo")
        {
            return Echo(args);
        }
        if (args.Length == 1 && args[0] == "vectors")
        {
            return Vectors();
        }
        if (args.Length == 1 && args[0] == "errors")
        {
            return Errors();
        }
        Console.Error.WriteLine("usage: EchoClient.exe echo ADDRESS ... | vectors | errors");
        return 2;
    }
}
