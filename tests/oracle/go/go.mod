module ipwebhook.test/oracle

go 1.19
