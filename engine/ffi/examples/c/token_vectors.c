/*
 * Checks the connect token test vectors through the C ABI: reads one vector a line on stdin,
 *
 *   KEY PROTOCOL_ID CLIENT_ID EXPIRES ADDR[,ADDR...] USER_DATA C2S_KEY S2C_KEY NONCE EXPECTED
 *
 * (keys, nonce, user data and the expected token in hex; "-" for empty user data), encodes
 * each with ricochet_token_encode and compares the bytes. Prints "N passed, N failed".
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static char line[8192];

int main(void) {
    int passed = 0, failed = 0;
    while (fgets(line, sizeof line, stdin)) {
        char key_hex[80], addrs[1024], data_hex[600], c2s_hex[80], s2c_hex[80], nonce_hex[64],
            expected_hex[2 * RICOCHET_CONNECT_TOKEN_LEN + 8];
        unsigned long long protocol_id, client_id, expires;
        if (sscanf(line, "%79s %llu %llu %llu %1023s %599s %79s %79s %63s %1577s", key_hex,
                   &protocol_id, &client_id, &expires, addrs, data_hex, c2s_hex, s2c_hex,
                   nonce_hex, expected_hex) != 10) {
            fprintf(stderr, "a line does not parse\n");
            failed++;
            continue;
        }
        uint8_t key[32], c2s[32], s2c[32], nonce[24], data[256],
            expected[RICOCHET_CONNECT_TOKEN_LEN], token[RICOCHET_CONNECT_TOKEN_LEN];
        long data_len = strcmp(data_hex, "-") == 0 ? 0 : hex_decode(data_hex, data, sizeof data);
        if (hex_decode(key_hex, key, 32) != 32 || hex_decode(c2s_hex, c2s, 32) != 32 ||
            hex_decode(s2c_hex, s2c, 32) != 32 || hex_decode(nonce_hex, nonce, 24) != 24 ||
            data_len < 0 ||
            hex_decode(expected_hex, expected, sizeof expected) != (long)sizeof expected) {
            fprintf(stderr, "a field does not decode\n");
            failed++;
            continue;
        }
        const char *servers[RICOCHET_MAX_SERVER_ADDRESSES];
        size_t count = 0;
        for (char *a = strtok(addrs, ","); a && count < RICOCHET_MAX_SERVER_ADDRESSES;
             a = strtok(NULL, ",")) {
            servers[count++] = a;
        }
        size_t len = 0;
        ricochet_status s = ricochet_token_encode(key, protocol_id, client_id, expires, servers,
                                                  count, data, (size_t)data_len, c2s, s2c, nonce,
                                                  token, sizeof token, &len);
        if (s != RICOCHET_OK || len != sizeof token || memcmp(token, expected, len) != 0) {
            fprintf(stderr, "vector %d: the encoded token differs (%s)\n", passed + failed,
                    ricochet_error_text((int32_t)s));
            failed++;
        } else {
            passed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0 || passed == 0;
}
